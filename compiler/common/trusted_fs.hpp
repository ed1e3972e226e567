// Files that hold code: one policy for every file and directory mKernel reads
// plans, cubins or plugins from (the cache, MK_PLAN_DIR, shipped plans,
// plugin libraries) and one way to write them.
//
// Reading. A tree is used only if
//  - its top directory (after resolving the symlinks the user named in its
//    path) and every ancestor up to / is owned by this user or root, and an
//    ancestor that others may write has the sticky bit (/tmp): nobody else
//    can rename the tree away and put another in its place;
//  - every directory and file read inside it is no symbolic link (a tree
//    never leaves itself), is owned by this user or root, and cannot be
//    written by others, nor by its group unless that group is this user's
//    private group (named after the user, no other members: Debian's
//    USERGROUPS, where pip and umask 002 make files group-writable).
// Files are opened with O_NOFOLLOW and checked on the open descriptor
// (fstat), so the file checked is the file read.
//
// Writing. Directories are created 0700 and files 0600 whatever the umask
// (fchmod on the descriptor), through a fresh temporary name (O_EXCL) and a
// rename, so no reader sees half a file and no other user's file is written.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace mk::tfs {

namespace fs = std::filesystem;

// Why an entry with this owner and mode may not hold what mKernel runs, or ""
// if it may. `gid` is the entry's group (for the private-group exception).
std::string mode_problem(uid_t uid, gid_t gid, mode_t mode);

// The same for the entry at `p` (lstat: a symbolic link is a problem).
std::string entry_problem(const fs::path& p);

// Why the tree at `top` may not be used, or "": `top` resolved, then itself
// (an entry) and every ancestor (owner root or this user; writable by others
// only with the sticky bit). `*real` gets the resolved path.
std::string tree_problem(const fs::path& top, fs::path* real = nullptr);

// The whole regular file `p` (an entry of a checked tree), at most `limit`
// bytes, opened without following a symbolic link and checked on the
// descriptor. `*why` says what went wrong: `failed` (missing, unreadable, too
// large, changed while read) or `untrusted` (a link, owner or mode the policy
// refuses).
enum class Read { ok, failed, untrusted };
Read read_file(const fs::path& p, size_t limit, std::vector<char>* out, std::string* why);

// An open descriptor of the regular file `p`, checked as read_file checks
// (the caller closes it), or -1 with `*why` (`*untrusted` set when the
// policy refused it). For dlopen("/proc/self/fd/N"):
// the library loaded is the file checked.
int open_checked(const fs::path& p, std::string* why, bool* untrusted = nullptr);

// A file of code the user named (a plugin library, a schedule file), by its
// resolved path `real`: read_file's checks (with `out`, the whole file of at
// most `limit` bytes into it; without, only opened and checked), then
// tree_problem of its directory (a refusal there is `untrusted`).
Read check_file_in_tree(const fs::path& real, size_t limit, std::vector<char>* out, std::string* why);

// Creates `dir` and its missing parents (0700); an existing `dir` must pass
// entry_problem. "" on success, else why.
std::string make_private_dir(const fs::path& dir);

// Writes `n` bytes to `p` with exactly `mode` (0600 in the cache, 0644 for
// plans the user ships) through a temporary file in the same directory and a
// rename. "" on success, else why (nothing left behind).
std::string write_file(const fs::path& p, const void* data, size_t n, mode_t mode);
inline std::string write_file(const fs::path& p, const std::string& s, mode_t mode) {
  return write_file(p, s.data(), s.size(), mode);
}
inline std::string write_private(const fs::path& p, const void* data, size_t n) {
  return write_file(p, data, n, 0600);
}
inline std::string write_private(const fs::path& p, const std::string& s) {
  return write_file(p, s.data(), s.size(), 0600);
}

// Creates `dir` and its missing parents with exactly `mode` (0755 for an
// output directory the user names; parents it creates too). "" or why.
std::string make_dir(const fs::path& dir, mode_t mode);

// A fresh private directory beside `final_dir` (same parent, 0700) to fill
// and then rename into place; "" with `*why` on failure.
fs::path make_temp_dir(const fs::path& final_dir, std::string* why);

}  // namespace mk::tfs
