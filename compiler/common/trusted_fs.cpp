// One policy for files that hold code (compiler/common/trusted_fs.hpp).
#include "compiler/common/trusted_fs.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace mk::tfs {
namespace {

// Whether `gid` is this user's private group: the user's primary group,
// named after the user, with no other listed members.
bool private_group(gid_t gid) {
  static std::mutex m;
  static std::map<gid_t, bool> known;
  std::lock_guard<std::mutex> lock(m);
  if (auto it = known.find(gid); it != known.end()) return it->second;
  bool yes = false;
  std::vector<char> buf(1 << 16);
  passwd pw{};
  passwd* pwp = nullptr;
  group gr{};
  group* grp = nullptr;
  if (::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size() / 2, &pwp) == 0 && pwp && pw.pw_gid == gid &&
      ::getgrgid_r(gid, &gr, buf.data() + buf.size() / 2, buf.size() / 2, &grp) == 0 && grp && gr.gr_name &&
      pw.pw_name && std::strcmp(gr.gr_name, pw.pw_name) == 0) {
    yes = true;
    for (char** m2 = gr.gr_mem; m2 && *m2; ++m2)
      if (std::strcmp(*m2, pw.pw_name) != 0) yes = false;
  }
  known[gid] = yes;
  return yes;
}

std::string owner_problem(uid_t uid) {
  if (uid == ::geteuid() || uid == 0) return "";
  return fmt::format("owned by uid {}, neither this user (uid {}) nor root", uid, ::geteuid());
}

// Read::ok, or what is wrong with the open file `fd` in `*why`.
Read check_fd(int fd, size_t limit, size_t* size, std::string* why) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *why = std::string("fstat: ") + std::strerror(errno);
    return Read::failed;
  }
  if (!S_ISREG(st.st_mode)) {
    *why = "not a regular file";
    return Read::failed;
  }
  if (std::string m = mode_problem(st.st_uid, st.st_gid, st.st_mode); !m.empty()) {
    *why = m;
    return Read::untrusted;
  }
  if (limit && size_t(st.st_size) > limit) {
    *why = fmt::format("{} bytes, more than the limit of {}", st.st_size, limit);
    return Read::failed;
  }
  if (size) *size = size_t(st.st_size);
  return Read::ok;
}

int open_nofollow(const fs::path& p, std::string* why, Read* r) {
  // O_NONBLOCK: a FIFO planted under the name does not block the open.
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    *r = errno == ELOOP ? Read::untrusted : Read::failed;
    *why = errno == ELOOP ? "a symbolic link (not followed)" : std::strerror(errno);
  }
  return fd;
}

}  // namespace

std::string mode_problem(uid_t uid, gid_t gid, mode_t mode) {
  if (std::string o = owner_problem(uid); !o.empty()) return o;
  if (mode & S_IWOTH) return fmt::format("writable by every user (mode {:04o})", mode & 07777);
  if ((mode & S_IWGRP) && !private_group(gid))
    return fmt::format("writable by its group (gid {}, mode {:04o}), which is not this user's private group", gid,
                       mode & 07777);
  return "";
}

std::string entry_problem(const fs::path& p) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return "a symbolic link (not followed)";
  return mode_problem(st.st_uid, st.st_gid, st.st_mode);
}

std::string tree_problem(const fs::path& top, fs::path* real) {
  std::error_code ec;
  const fs::path r = fs::canonical(top, ec);
  if (ec) return ec.message();
  if (real) *real = r;
  if (std::string e = entry_problem(r); !e.empty()) return r.string() + " is " + e;
  for (fs::path a = r.parent_path();; a = a.parent_path()) {
    struct stat st {};
    if (::lstat(a.c_str(), &st) != 0) return a.string() + ": " + std::strerror(errno);
    if (std::string o = owner_problem(st.st_uid); !o.empty()) return fmt::format("its parent {} is {}", a.string(), o);
    if ((st.st_mode & (S_IWOTH | S_IWGRP)) && !(st.st_mode & S_ISVTX) &&
        ((st.st_mode & S_IWOTH) || !private_group(st.st_gid)))
      return fmt::format("its parent {} can be written by {} (mode {:04o}, no sticky bit): the tree can be replaced",
                         a.string(), st.st_mode & S_IWOTH ? "every user" : "its group", st.st_mode & 07777);
    if (a == a.root_path() || a.empty()) break;
  }
  return "";
}

int open_checked(const fs::path& p, std::string* why, bool* untrusted) {
  Read r = Read::ok;
  int fd = open_nofollow(p, why, &r);
  if (fd >= 0 && (r = check_fd(fd, 0, nullptr, why)) != Read::ok) {
    ::close(fd);
    fd = -1;
  }
  if (untrusted) *untrusted = r == Read::untrusted;
  return fd;
}

Read read_file(const fs::path& p, size_t limit, std::vector<char>* out, std::string* why) {
  Read r = Read::ok;
  const int fd = open_nofollow(p, why, &r);
  if (fd < 0) return r;
  size_t size = 0;
  if ((r = check_fd(fd, limit, &size, why)) != Read::ok) {
    ::close(fd);
    return r;
  }
  out->resize(size);
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, out->data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += size_t(n);
  }
  char extra = 0;
  const bool grew = got == size && ::read(fd, &extra, 1) > 0;
  ::close(fd);
  if (got != size || grew) {
    *why = "changed while being read";
    return Read::failed;
  }
  return Read::ok;
}

std::string make_dir(const fs::path& dir, mode_t mode) {
  fs::path cur;
  for (const auto& part : dir) {
    cur /= part;
    if (::mkdir(cur.c_str(), mode) == 0) {
      if (::chmod(cur.c_str(), mode) != 0)  // the umask took bits away
        return fmt::format("cannot chmod {}: {}", cur.string(), std::strerror(errno));
    } else if (errno != EEXIST) {
      return fmt::format("cannot create {}: {}", cur.string(), std::strerror(errno));
    }
  }
  return "";
}

std::string make_private_dir(const fs::path& dir) {
  if (std::string why = make_dir(dir, 0700); !why.empty()) return why;
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return fmt::format("cannot stat {}: {}", dir.string(), std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return dir.string() + " is not a directory";
  if (std::string e = mode_problem(st.st_uid, st.st_gid, st.st_mode); !e.empty()) return dir.string() + " is " + e;
  return "";
}

Read check_file_in_tree(const fs::path& real, size_t limit, std::vector<char>* out, std::string* why) {
  Read r = Read::ok;
  if (out) {
    r = read_file(real, limit, out, why);
  } else {
    bool untrusted = false;
    const int fd = open_checked(real, why, &untrusted);
    if (fd >= 0) ::close(fd);
    else r = untrusted ? Read::untrusted : Read::failed;
  }
  if (r == Read::ok && !(*why = tree_problem(real.parent_path())).empty()) r = Read::untrusted;
  return r;
}

std::string write_file(const fs::path& p, const void* data, size_t n, mode_t mode) {
  static std::atomic<uint64_t> seq{0};
  fs::path tmp = p;
  tmp += fmt::format(".tmp.{}.{}", ::getpid(), seq++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return fmt::format("cannot create {}: {}", tmp.string(), std::strerror(errno));
  std::string why;
  if (::fchmod(fd, mode) != 0) why = fmt::format("cannot chmod {}: {}", tmp.string(), std::strerror(errno));
  const auto* b = static_cast<const char*>(data);
  for (size_t off = 0; why.empty() && off < n;) {
    const ssize_t w = ::write(fd, b + off, n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) why = fmt::format("cannot write {}: {}", tmp.string(), w < 0 ? std::strerror(errno) : "short write");
    else off += size_t(w);
  }
  if (::close(fd) != 0 && why.empty()) why = fmt::format("cannot write {}: {}", tmp.string(), std::strerror(errno));
  if (why.empty() && ::rename(tmp.c_str(), p.c_str()) != 0)
    why = fmt::format("cannot rename into {}: {}", p.string(), std::strerror(errno));
  if (!why.empty()) ::unlink(tmp.c_str());
  return why;
}

fs::path make_temp_dir(const fs::path& final_dir, std::string* why) {
  std::string tmpl = final_dir.string() + ".tmp.XXXXXX";
  if (!::mkdtemp(tmpl.data())) {  // mkdtemp creates 0700
    *why = fmt::format("cannot create a directory beside {}: {}", final_dir.string(), std::strerror(errno));
    return {};
  }
  return tmpl;
}

}  // namespace mk::tfs
