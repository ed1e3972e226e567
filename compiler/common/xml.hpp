// Text for XML and SVG documents (the MSCCL exporter, `mkc show --svg`).
#pragma once

#include <string>
#include <string_view>

namespace mk {

// `s` as XML character data or an attribute value: < > & " ' escaped; other
// control characters become spaces, except newlines with `keep_newlines`
// (written as &#10;, which survives in attributes and tooltips).
inline std::string xml_escape(std::string_view s, bool keep_newlines = false) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      case '\n':
        o += keep_newlines ? "&#10;" : " ";
        break;
      default: o += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
    }
  }
  return o;
}

}  // namespace mk
