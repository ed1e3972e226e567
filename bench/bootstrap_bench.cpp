// The bootstrap at scale: N processes of this machine join one rendezvous
// and run three all-gathers of 256-byte blobs (what communicator init does:
// device info, settings, the last barrier's worth), timed from the moment
// they get the unique id until the last rank is done; the median over a few
// runs. Over loopback TCP on one host: it measures the protocol's messages,
// wake-ups and CPU (MACs included), not a network.
//
//   mk_bootstrap_bench [--ranks 64,256,1024] [--runs 5] [--blob 256] [--gathers 3] [--modes direct,relay]
//
// Modes: "direct" (all-gathers rank to rank, the default since 2026-12-07)
// and "relay" (MK_BOOTSTRAP_RELAY=1 in the ranks: through the root, the
// design before). The ranks are forked before the id exists, so the timing
// starts with every process already running; each holds a few descriptors,
// the root (this process) one per rank: the soft RLIMIT_NOFILE is raised to
// the hard limit and checked. The program compiles against the bootstrap
// of earlier commits too (only Bootstrap, allgather and
// bootstrap_create_id), which is how bench/results/2026-12-07-bootstrap-scale.md
// measured the code before this change.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mk.h"
#include "runtime/bootstrap/bootstrap.hpp"

namespace {

double now_s() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // one clock for every process of the host
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

struct Done {
  int32_t rank;
  int32_t ok;
  double joined;  // when its rendezvous completed
  double end;     // when its last all-gather returned
};
static_assert(sizeof(Done) <= 4096, "one atomic pipe write");

// Rank `rank`'s part of all-gather k: its rank and k, then a byte of both
// (cheap to check: the check must not cost more than the exchange).
std::string blob_of(int rank, int k, size_t bytes) {
  std::string s(bytes, char(rank * 7 + k));
  const int32_t head[2] = {rank, k};
  std::memcpy(s.data(), head, std::min(bytes, sizeof head));
  return s;
}

bool full_read(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t got = ::read(fd, c, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    c += got;
    n -= size_t(got);
  }
  return true;
}

bool full_write(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t put = ::write(fd, c, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    c += put;
    n -= size_t(put);
  }
  return true;
}

// One rank: waits for the id, joins, all-gathers, reports.
[[noreturn]] void rank_main(int rank, int n, int go, int done, size_t blob, int gathers, bool relay) {
  if (relay)
    ::setenv("MK_BOOTSTRAP_RELAY", "1", 1);
  else
    ::unsetenv("MK_BOOTSTRAP_RELAY");
  mkUniqueId id;
  if (!full_read(go, &id, sizeof id)) ::_exit(2);
  Done d{rank, 1, 0, 0};
  try {
    mk::rt::Bootstrap b(id, n, rank);
    d.joined = now_s();
    for (int k = 0; k < gathers; ++k) {
      const auto all = b.allgather(blob_of(rank, k, blob));
      d.ok = d.ok && all.size() == size_t(n);
      for (int q = 0; q < n && d.ok; ++q) {
        const std::string& got = all[size_t(q)];
        const int32_t head[2] = {q, k};
        d.ok = got.size() == blob && std::memcmp(got.data(), head, std::min(blob, sizeof head)) == 0 &&
               (blob <= sizeof head ||
                std::count(got.begin() + sizeof head, got.end(), char(q * 7 + k)) == ptrdiff_t(blob - sizeof head));
      }
    }
    d.end = now_s();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    d.ok = 0;
  }
  full_write(done, &d, sizeof d);
  ::_exit(d.ok ? 0 : 1);
}

struct Run {
  bool ok = false;
  double join = 0, total = 0;
};

Run run_once(int n, size_t blob, int gathers, bool relay) {
  int go[2], done[2];
  if (::pipe(go) != 0 || ::pipe(done) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      std::exit(1);
    }
    if (pid == 0) {
      ::close(go[1]);
      ::close(done[0]);
      rank_main(r, n, go[0], done[1], blob, gathers, relay);
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(done[1]);
  mkUniqueId id;
  mk::rt::bootstrap_create_id(&id);  // the root: a thread of this process, as with mkGetUniqueId
  const double t0 = now_s();
  for (int r = 0; r < n; ++r) full_write(go[1], &id, sizeof id);  // 128 bytes: each rank reads one whole copy
  Run run;
  run.ok = true;
  for (int r = 0; r < n; ++r) {
    Done d{};
    if (!full_read(done[0], &d, sizeof d)) {
      run.ok = false;
      break;
    }
    run.ok = run.ok && d.ok;
    run.join = std::max(run.join, d.joined - t0);
    run.total = std::max(run.total, d.end - t0);
  }
  for (pid_t p : pids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    run.ok = run.ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  ::close(go[1]);
  ::close(done[0]);
  // The root ends when every rank has gone; no thread may run at the next fork.
  for (int i = 0; i < 5000 && mk::rt::bootstrap_live_servers() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return run;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t c = std::min(s.find(',', at), s.size());
    if (c > at) out.push_back(s.substr(at, c - at));
    at = c + 1;
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks = {64, 256, 1024};
  std::vector<std::string> modes = {"relay", "direct"};
  int runs = 5, gathers = 3;
  size_t blob = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--ranks") {
      ranks.clear();
      for (const auto& x : split(v)) ranks.push_back(std::atoi(x.c_str()));
    } else if (k == "--runs") {
      runs = std::atoi(v.c_str());
    } else if (k == "--blob") {
      blob = size_t(std::atol(v.c_str()));
    } else if (k == "--gathers") {
      gathers = std::atoi(v.c_str());
    } else if (k == "--modes") {
      modes = split(v);
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  const rlim_t soft = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  ::getrlimit(RLIMIT_NOFILE, &rl);
  const int most = *std::max_element(ranks.begin(), ranks.end());
  std::printf("# RLIMIT_NOFILE: soft %llu, raised to %llu (hard); the root holds one descriptor per rank (%d)\n",
              (unsigned long long)soft, (unsigned long long)rl.rlim_cur, most);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < rlim_t(most) + 64) {
    std::fprintf(stderr, "RLIMIT_NOFILE %llu is too low for %d ranks: raise it (ulimit -n %d)\n",
                 (unsigned long long)rl.rlim_cur, most, most + 64);
    return 1;
  }
  std::printf("# %d all-gather(s) of %zu bytes per rank after the rendezvous; %d runs per row; seconds from the id "
              "to the last rank done (rendezvous: to the last rank joined)\n",
              gathers, blob, runs);
  std::printf("| ranks | mode | median total (s) | min | max | median rendezvous (s) |\n|---:|---|---:|---:|---:|---:|\n");
  std::fflush(stdout);
  for (int n : ranks)
    for (const std::string& mode : modes) {
      std::vector<double> total, join;
      for (int r = 0; r < runs; ++r) {
        const Run run = run_once(n, blob, gathers, mode == "relay");
        if (!run.ok) {
          std::fprintf(stderr, "%d ranks, %s: a rank failed\n", n, mode.c_str());
          return 1;
        }
        total.push_back(run.total);
        join.push_back(run.join);
      }
      std::printf("| %d | %s | %.3f | %.3f | %.3f | %.3f |\n", n, mode.c_str(), median(total),
                  *std::min_element(total.begin(), total.end()), *std::max_element(total.begin(), total.end()),
                  median(join));
      std::fflush(stdout);
    }
  return 0;
}
