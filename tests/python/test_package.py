"""The Python package, end to end on a CPU machine: the wheel builds with the
in-repo backend and no network, installs into a fresh virtualenv, and the
installed package works: the compiler (mkc, python -m mkernel, verify,
compile), mkernel-run, clear errors without a driver, and communicators,
collectives, groups, prewarm and the shipped plans against the fake driver
(tests/fake_cuda) in one and in two processes.

    python3 tests/python/test_package.py BUILD_DIR     (ctest runs it)
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(SRC, "build"))
FAKE = os.path.join(BUILD, "tests", "fake_cuda")
TMP = tempfile.mkdtemp(prefix="mk-pytest-")
VENV = os.path.join(TMP, "venv")
PY = os.path.join(VENV, "bin", "python")


def run(cmd, env=None, check=True, cwd=TMP, timeout=600):
    e = dict(os.environ)
    for k in ("MK_PREBUILT_DIR", "MK_LIBMKERNEL", "MK_MKC", "MK_PREFIX", "LD_LIBRARY_PATH", "PYTHONPATH"):
        e.pop(k, None)
    e.update(env or {})
    p = subprocess.run(cmd, cwd=cwd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError("%s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout))
    return p


def py(code, env=None, check=True):
    """Runs `code` in the virtualenv's Python, outside the source tree."""
    if code.startswith(ALLOC):
        code = ALLOC + textwrap.dedent(code[len(ALLOC):])
    return run([PY, "-c", textwrap.dedent(code)], env=env, check=check)


def fake_env(cache, **extra):
    env = {"LD_LIBRARY_PATH": FAKE, "MK_CACHE_DIR": cache, "MKFAKE_DEVICES": "4", "MKFAKE_ARCH": "90",
           "NCCL_NVLS_ENABLE": "0"}
    env.update(extra)
    return env


def plans_in(cache):
    d = os.path.join(cache, "plans")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


# Device memory from the (fake) driver, for the child scripts.
ALLOC = """
import ctypes, mkernel
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
def dalloc(nbytes, device=0):
    mkernel.set_device(device)
    p = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)) == 0
    return p.value
def shared_uid(rank, path):
    # rank 0 makes the unique id and writes it (atomically); the others wait for the file
    import os, time
    if rank == 0:
        uid = mkernel.get_unique_id()
        with open(path + ".tmp", "wb") as f:
            f.write(uid)
        os.rename(path + ".tmp", path)
        return uid
    while not os.path.exists(path):
        time.sleep(0.01)
    return open(path, "rb").read()
"""

# Two ranks of one process, one fp32 all-reduce of 4 KiB (allreduce.one_shot).
ONE_ALLREDUCE = ALLOC + """
comms = mkernel.Communicator.init_all([0, 1])
s, r = dalloc(1 << 16), dalloc(1 << 16)
s1, r1 = dalloc(1 << 16, 1), dalloc(1 << 16, 1)
with mkernel.group():
    comms[0].all_reduce(s, r, 1024, "fp32")
    comms[1].all_reduce(s1, r1, 1024, "fp32")
for c in comms:
    c.destroy()
print("CALLS OK")
"""


class Package(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # A small set of shipped plans (2 ranks, fp32, sm_90: what the fake
        # driver's GPUs are), then the wheel, then a fresh virtualenv.
        cls.prebuilt = os.path.join(TMP, "prebuilt")
        run([os.path.join(BUILD, "mkc"), "prebuild", "--ranks", "2", "--dtype", "fp32", "--arch", "sm_90", "-o",
             cls.prebuilt], env={"MK_CACHE_DIR": os.path.join(TMP, "prebuild-cache"), "MK_PREBUILT_DIR": ""})
        wheels = os.path.join(TMP, "wheels")
        run([sys.executable, "-m", "pip", "wheel", "--no-index", "--no-deps", "--no-cache-dir", "-w", wheels,
             "-C", "build-dir=" + BUILD, "-C", "prebuilt=" + cls.prebuilt, SRC])
        found = glob.glob(os.path.join(wheels, "mkernel-*.whl"))
        assert len(found) == 1, found
        cls.wheel = found[0]
        run([sys.executable, "-m", "venv", VENV])
        run([PY, "-m", "pip", "install", "--no-index", "--no-cache-dir", cls.wheel])

    def test_wheel_name_and_contents(self):
        import zipfile

        name = os.path.basename(self.wheel)
        self.assertRegex(name, r"^mkernel-\d+\.\d+\.\d+-py3-none-manylinux_\d+_\d+_x86_64\.whl$")
        z = zipfile.ZipFile(self.wheel)
        names = set(z.namelist())
        for must in ("mkernel/__init__.py", "mkernel/torch.py", "mkernel/lib/libmkernel.so.0",
                     "mkernel/lib/mkernel/nccl/libnccl.so.2", "mkernel/bin/mkc", "mkernel/bin/mkernel-run",
                     "mkernel/share/mkernel/prebuilt/index.json", "mkernel/include/mk.h",
                     "mkernel/share/mkernel/select.json"):
            self.assertIn(must, names)
        dist = [n for n in names if n.endswith(".dist-info/RECORD")]
        self.assertEqual(len(dist), 1)
        record = z.read(dist[0]).decode()
        # every file but RECORD itself is listed with its hash
        listed = {line.split(",")[0] for line in record.splitlines() if line}
        self.assertEqual(listed, names)
        mode = z.getinfo("mkernel/bin/mkc").external_attr >> 16
        self.assertTrue(mode & 0o111, "mkc is not executable in the wheel")

    def test_import_without_driver_is_a_clear_error(self):
        p = py("""
            import mkernel
            assert mkernel.version() >= 100, mkernel.version()
            try:
                mkernel.Communicator(1, 0, mkernel.get_unique_id())
            except mkernel.MkError as e:
                print("ERR", e.name, e)
        """)
        self.assertIn("ERR mkSystemError", p.stdout)
        self.assertIn("libcuda.so.1", p.stdout)

    def test_compiler_from_python_and_command_line(self):
        out = os.path.join(TMP, "plan-out")
        p = py("""
            import mkernel
            print(mkernel.verify("allreduce.ring", ranks=4).splitlines()[0])
            try:
                mkernel.verify("allreduce.nope", ranks=4)
            except mkernel.CompileError as e:
                print("REFUSED", e.returncode, str(e).splitlines()[0])
            print(mkernel.compile("allgather.direct", %r, ranks=2, dtype="bf16"))
            print(mkernel.verify(fusion="allreduce.rmsnorm", dtype="bf16").splitlines()[0])
            print(mkernel.verify("allreduce.ring", ranks=3, strict=True, dtype="fp32").splitlines()[0])
        """ % out, env={"MK_CACHE_DIR": os.path.join(TMP, "c1")})
        self.assertIn("proved: allreduce.ring", p.stdout)
        self.assertIn("checked: fusion allreduce.rmsnorm", p.stdout)
        self.assertIn("bit-identical results, fp32 sum", p.stdout)
        self.assertIn("REFUSED 1 mkc: error: [mk.cli.E001] unknown schedule 'allreduce.nope'", p.stdout)
        self.assertTrue(os.path.isfile(os.path.join(out, "plan.json")))
        # the console script and python -m are mkc, and use the package's own library
        for cmd in ([os.path.join(VENV, "bin", "mkc"), "info"], [PY, "-m", "mkernel", "info"]):
            info = run(cmd).stdout
            self.assertIn(os.path.join(VENV, "lib"), info.split("prebuilt plans:")[1].splitlines()[0], info)
        self.assertIn("allreduce.ring", run([os.path.join(VENV, "bin", "mkc"), "list"]).stdout)

    def test_mkernel_run_preloads_the_packaged_library(self):
        p = run([os.path.join(VENV, "bin", "mkernel-run"), "sh", "-c", "echo $LD_PRELOAD; echo $NCCL_NVLS_ENABLE"])
        first, nvls = p.stdout.strip().splitlines()[-2:]
        self.assertTrue(first.startswith(os.path.join(VENV, "lib")), first)
        self.assertTrue(first.endswith("mkernel/lib/mkernel/nccl/libnccl.so.2"), first)
        self.assertEqual(nvls, "0")
        self.assertEqual(run([os.path.join(VENV, "bin", "mkernel-run")], check=False).returncode, 2)

    def test_collectives_groups_and_errors_on_the_fake_driver(self):
        cache = os.path.join(TMP, "c-coll")
        p = py(ALLOC + """
            comms = mkernel.Communicator.init_all([0, 1])
            assert [c.rank for c in comms] == [0, 1] and comms[1].size == 2 and comms[1].device == 1, comms
            n = 4096
            bufs = [(dalloc(4 * n * 2, d), dalloc(4 * n * 2, d)) for d in (0, 1)]
            with mkernel.group():
                for c, (s, r) in zip(comms, bufs):
                    c.all_reduce(s, r, n, "fp32", "sum")
            with mkernel.group():
                for c, (s, r) in zip(comms, bufs):
                    c.all_gather(s, r, n, "float32")
            with mkernel.group():
                for c, (s, r) in zip(comms, bufs):
                    c.reduce_scatter(s, r, n // 2, mkernel.DTYPES["fp32"], "sum")
            # bad input: each a clear MkError with mKernel's words
            for bad in (lambda: comms[0].all_reduce(bufs[0][0], bufs[0][1], n, "complex64"),
                        lambda: comms[0].all_reduce(bufs[0][0], bufs[0][1], n, "fp32", "xor"),
                        lambda: comms[0].all_reduce(None, bufs[0][1], n, "fp32"),
                        lambda: comms[0].broadcast(bufs[0][0], bufs[0][1], n, "fp32", root=5)):
                try:
                    bad()
                    print("NO ERROR")
                except mkernel.MkError as e:
                    print("ERR", e.name, e)
            for c in comms:
                c.destroy()
            try:
                comms[0].all_reduce(bufs[0][0], bufs[0][1], n, "fp32")
            except mkernel.MkError as e:
                print("ERR", e.name, e)
            print("DONE")
        """, env=fake_env(cache))
        out = p.stdout
        self.assertIn("DONE", out)
        self.assertNotIn("NO ERROR", out)
        self.assertIn("unknown dtype 'complex64'", out)
        self.assertIn("unknown reduction op 'xor'", out)
        self.assertIn("ERR mkInvalidArgument mkAllReduce:", out)  # NULL sendbuff, in mKernel's words
        self.assertIn("root 5 is not a rank of 2", out)
        self.assertIn("this communicator was destroyed", out)
        # The shipped plans served these calls: nothing was compiled into the cache.
        self.assertEqual(plans_in(cache), [])

    def test_composite_runs_as_one_group_kernel_on_the_fake_driver(self):
        cache = os.path.join(TMP, "c-composite")
        p = py(ALLOC + """
            comms = mkernel.Communicator.init_all([0, 1])
            n = 4096
            bufs = [[dalloc(4 * n * 2, d) for _ in range(4)] for d in (0, 1)]
            with mkernel.group():
                for c, b in zip(comms, bufs):
                    c.composite("composite.zero_step", b, n, "fp32")
            try:
                comms[0].composite("composite.zero_step", bufs[0][:3], n, "fp32")
                print("NO ERROR")
            except mkernel.MkError as e:
                print("ERR", e.name, e)
            for c in comms:
                c.destroy()
            print("DONE")
        """, env=fake_env(cache))
        out = p.stdout
        self.assertIn("DONE", out)
        self.assertNotIn("NO ERROR", out)
        self.assertIn("ERR mkInvalidArgument", out)
        self.assertIn("3 buffer(s) given", out)

    def test_schedules_argument_reaches_the_config(self):
        cache = os.path.join(TMP, "c-sched")
        good = os.path.join(SRC, "tests", "fixtures", "mscclpp", "allreduce_tbg_2.json")
        p = py(ALLOC + """
            import os
            uid = mkernel.get_unique_id()
            for bad in (["/nonexistent/mine.xml"], ["a:b"], [""], [b"/tmp/x\\0y.xml"], [b"/nonexistent/\\xffring.xml"]):
                try:
                    mkernel.Communicator(1, 0, uid, device=0, schedules=bad)
                    print("NO ERROR", bad)
                except mkernel.MkError as e:
                    print("ERR", e.name, e)
            # a 2-rank algorithm loads for a 1-rank communicator: not a candidate there, no error
            comm = mkernel.Communicator(1, 0, mkernel.get_unique_id(), device=0, schedules=%r)
            s, r = dalloc(4096, 0), dalloc(4096, 0)
            comm.all_reduce(s, r, 256, "fp32", "sum")
            comm.destroy()
            print("DONE")
        """ % good, env=fake_env(cache))
        out = p.stdout
        self.assertIn("DONE", out, out)
        self.assertNotIn("NO ERROR", out)
        self.assertIn("schedule file '/nonexistent/mine.xml' does not exist", out)
        self.assertIn("holds ':', the list separator", out)
        self.assertIn("or a NUL", out)
        self.assertIn("ERR mkInvalidArgument", out)
        self.assertNotIn("UnicodeEncodeError", out)
        self.assertIn("ring.xml' does not exist", out)  # a path that is not UTF-8: MkError, not UnicodeEncodeError

    def test_without_shipped_plans_the_same_calls_compile(self):
        cache = os.path.join(TMP, "c-noship")
        self.assertIn("CALLS OK", py(ONE_ALLREDUCE, env=fake_env(cache, MK_PREBUILT_DIR="")).stdout)
        # allreduce.one_shot: one plan per rank, each holding its own rank's
        # code path (a one-pass kernel's ranks differ: a rank's first call
        # compiles only its own)
        self.assertEqual(len(plans_in(cache)), 2)

    def test_damaged_or_mismatched_shipped_plans_are_not_used(self):
        import json

        one_call = ONE_ALLREDUCE
        with open(os.path.join(self.prebuilt, "index.json")) as f:
            index = json.load(f)
        one_shot = sorted({d for d in index["plans"].values() if d.startswith("allreduce.one_shot_n2_fp32")})
        # (an all-gather's plan serves every 4-byte type: compiled for uint32)
        other = sorted({d for d in index["plans"].values() if d.startswith("allgather.direct_n2_uint32")})
        # one-shot's one-pass kernel has a code path per rank: a plan per rank
        self.assertEqual((len(one_shot), len(other)), (2, 1))
        # 1: the one-shot plans' cubins truncated; 2: their keys pointed at the
        # allgather plan; 3: index.json not JSON; 4: the directory writable by
        # everyone; 5: only the plan's own directory writable by everyone; 6:
        # the directory owned by another user (root only: chown); 7: a plan of
        # another mKernel version. Each time the call compiles its own plan
        # and succeeds.
        cases = ["truncated", "mismatched", "garbage", "writable by others", "plan dir writable", "version"]
        if os.geteuid() == 0:
            cases.append("other owner")
        for case in cases:
            d = os.path.join(TMP, "prebuilt-" + case)
            shutil.copytree(self.prebuilt, d)
            if case == "truncated":
                for plan_dir in one_shot:
                    cubin = glob.glob(os.path.join(d, plan_dir, "*.cubin"))[0]
                    with open(cubin, "r+b") as f:
                        f.truncate(100)
            elif case == "mismatched":
                bad = {k: (other[0] if v in one_shot else v) for k, v in index["plans"].items()}
                with open(os.path.join(d, "index.json"), "w") as f:
                    json.dump({"format": 1, "plans": bad}, f)
            elif case == "garbage":
                with open(os.path.join(d, "index.json"), "w") as f:
                    f.write("{not json")
            elif case == "writable by others":
                os.chmod(d, 0o777)
            elif case == "plan dir writable":
                for plan_dir in one_shot:
                    os.chmod(os.path.join(d, plan_dir), 0o777)
            elif case == "version":
                for plan_dir in one_shot:
                    pj = os.path.join(d, plan_dir, "plan.json")
                    with open(pj) as f:
                        plan = json.load(f)
                    plan["mkernel_version"] = "0.0.1"
                    with open(pj, "w") as f:
                        json.dump(plan, f)
            else:
                os.chown(d, 65534, 65534)
            cache = os.path.join(TMP, "c-" + case.replace(" ", "-"))
            p = py(one_call, env=fake_env(cache, MK_PREBUILT_DIR=d, MK_DEBUG="1"))
            self.assertIn("CALLS OK", p.stdout)
            # compiled instead: one-shot's two ranks, a plan each (its own code path)
            self.assertEqual(len(plans_in(cache)), 2, case)
            self.assertIn("not used", p.stdout, case)

    def test_premul_sum(self):
        cache = os.path.join(TMP, "c-premul")
        p = py(ALLOC + """
            from mkernel import _api
            comms = mkernel.Communicator.init_all([0, 1])
            s, r = dalloc(1 << 16), dalloc(1 << 16)
            s1, r1 = dalloc(1 << 16, 1), dalloc(1 << 16, 1)
            ops = [c.premul_sum(0.5 * (i + 1), "bf16") for i, c in enumerate(comms)]
            print("OPS", ops)
            with mkernel.group():
                comms[0].all_reduce(s, r, 1000, "bf16", ops[0])
                comms[1].all_reduce(s1, r1, 1000, "bf16", ops[1])
            try:
                comms[0].all_reduce(s, r, 1000, "fp32", ops[0])
            except mkernel.MkError as e:
                print("ERR1", e)
            try:
                comms[0].premul_sum("x", "fp32")
            except mkernel.MkError as e:
                print("ERR2", e)
            for c, op in zip(comms, ops):
                c.destroy_op(op)
            try:
                comms[0].destroy_op(ops[0])
            except mkernel.MkError as e:
                print("ERR3", e)
            comms[0].prewarm(dtypes=["fp64"], ops=["sum", "premulsum"], threads=2)  # a temporary op, then freed
            print("AFTER PREWARM", comms[0].premul_sum(1.0, "fp64"))  # a fresh handle: freed ones are never reused
            print("BYTES", _api._scalar_bytes(1.25, 9).hex(), _api._scalar_bytes(1.75, 10).hex(),
                  _api._scalar_bytes(1000, 10).hex(), _api._scalar_bytes(-3, 2).hex())
            print("FP8", _api._scalar_bytes(0.0, 10).hex(), _api._scalar_bytes(1e30, 11).hex(),
                  _api._scalar_bytes(-1e30, 10).hex(), _api._scalar_bytes(-0.0, 10).hex())
            try:
                comms[0].premul_sum(float("inf"), "fp8e4m3")
            except mkernel.MkError as e:
                print("ERR4", e)
            for c in comms:
                c.destroy()
        """, env=fake_env(cache))
        # handles are never reused and unique in the process: one op per communicator, 5 and 6
        self.assertIn("OPS [5, 6]", p.stdout)
        self.assertIn("created for bf16", p.stdout)
        self.assertIn("ERR2", p.stdout)
        self.assertIn("not a live PreMulSum op", p.stdout)
        # bf16 1.25 = 0x3fa0, e4m3 1.75 = 0x3e, 1000 saturates to 448 = 0x7e
        self.assertIn("BYTES a03f 3e 7e fdffffff", p.stdout)
        self.assertIn("AFTER PREWARM 8", p.stdout)  # 7 was prewarm's temporary op
        # zeros keep their sign; far out saturates to the largest finite value (e5m2 57344, e4m3 -448)
        self.assertIn("FP8 00 7b fe 80", p.stdout)
        self.assertIn("must be finite", p.stdout)
        plans = [open(os.path.join(cache, "plans", d, "plan.json")).read() for d in os.listdir(os.path.join(cache, "plans"))]
        # only prewarm made fp64 PreMulSum plans (the calls above are bf16)
        self.assertTrue(any('"premulsum"' in t and '"fp64"' in t for t in plans))

    def test_prewarm(self):
        cache = os.path.join(TMP, "c-prewarm")
        p = py(ALLOC + """
            import time
            comms = mkernel.Communicator.init_all([0, 1])
            t = time.perf_counter()
            mkernel.prewarm(comms[0], dtypes=["fp32"])          # shipped: nothing to compile
            print("fp32 prewarm ms", (time.perf_counter() - t) * 1e3)
            mkernel.prewarm(comms[0], dtypes=["bf16", "fp16"], ops=["sum", "max"], threads=2)
            try:
                mkernel.prewarm(comms[0], dtypes=["nope"])
            except mkernel.MkError as e:
                print("ERR", e)
            for c in comms:
                c.destroy()
        """, env=fake_env(cache))
        self.assertIn("unknown dtype 'nope'", p.stdout)
        got = plans_in(cache)
        # rank 0 at 2 ranks, bf16 and fp16: allreduce (one_shot, ring) and
        # reducescatter and reduce for sum and max, (2 + 1 + 1) * 2 ops = 8
        # plans per dtype; allgather, broadcast and alltoall once for both
        # (one plan serves every 2-byte type): 8 * 2 + 3
        self.assertEqual(len(got), 19, got)

    def test_two_processes(self):
        cache = os.path.join(TMP, "c-2p")
        script = os.path.join(TMP, "two.py")
        with open(script, "w") as f:
            f.write(ALLOC + textwrap.dedent("""
                import os, sys, time
                rank, uidfile = int(sys.argv[1]), sys.argv[2]
                uid = shared_uid(rank, uidfile)
                if rank == 0:
                    # nonblocking: while rank 1 has not joined, calls report
                    # mkInProgress (an error from anything but init itself)
                    comm = mkernel.Communicator(2, rank, uid, device=rank, blocking=False)
                    try:
                        print("size while in progress:", comm.size)
                    except mkernel.MkError as e:
                        print("in progress:", e.name)
                    while not comm.ready():
                        time.sleep(0.01)
                else:
                    time.sleep(1.0)
                    comm = mkernel.Communicator(2, rank, uid, device=rank)
                got = comm.bootstrap_broadcast(b"hello from 0" if rank == 0 else b"x" * 12, root=0)
                s, r = dalloc(1 << 20, rank), dalloc(1 << 20, rank)
                comm.all_reduce(s, r, 1 << 16, "fp32", "sum")
                comm.broadcast(s, r, 1 << 16, "fp32", root=1)
                comm.destroy()
                print("rank", rank, got.decode(), "ok")
            """))
        uid = os.path.join(TMP, "uid")
        env = fake_env(cache)
        e = dict(os.environ)
        e.update(env)
        for k in ("MK_PREBUILT_DIR", "PYTHONPATH"):
            e.pop(k, None)
        ps = [subprocess.Popen([PY, script, str(r), uid], cwd=TMP, env=e, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
        outs = [p.communicate(timeout=300)[0] for p in ps]
        for r, (p, o) in enumerate(zip(ps, outs)):
            self.assertEqual(p.returncode, 0, o)
            self.assertIn("rank %d hello from 0 ok" % r, o)
        self.assertIn("in progress: mkInProgress", outs[0])

    def test_shrink_leaves_out_a_dead_rank(self):
        # Three processes; rank 0 (whose process holds the rendezvous) ends
        # without a word after init; ranks 1 and 2 first see an exchange
        # fail, wait past the rendezvous's grace, then shrink and run on the
        # new communicator.
        cache = os.path.join(TMP, "c-shrink")
        script = os.path.join(TMP, "shrink.py")
        with open(script, "w") as f:
            f.write(ALLOC + textwrap.dedent("""
                import os, sys, time
                rank, uidfile = int(sys.argv[1]), sys.argv[2]
                uid = shared_uid(rank, uidfile)
                comm = mkernel.Communicator(3, rank, uid, device=rank)
                comm.bootstrap_broadcast(b"x", root=0)
                if rank == 0:
                    time.sleep(0.3)  # the others finished that broadcast: then it ends without a word
                    os._exit(0)
                try:
                    comm.bootstrap_broadcast(b"y", root=1)
                    print("rank", rank, "exchange ran")
                except mkernel.MkError as e:
                    print("rank", rank, "exchange failed:", e.name)
                time.sleep(3)
                try:
                    comm.shrink([rank])
                except mkernel.MkError as e:
                    print("rank", rank, "refused:", e.name)
                small = comm.shrink([0], abort=True)
                s = dalloc(1 << 16, rank)
                small.all_reduce(s, s, 1 << 10, "fp32", "sum")
                got = small.bootstrap_broadcast(b"from one" if rank == 1 else b"x" * 8, root=0)
                print("rank", rank, "size", small.size, "rank", small.rank, got.decode())
                small.destroy()
                comm.abort()
            """))
        uid = os.path.join(TMP, "uid-shrink")
        e = dict(os.environ)
        e.update(fake_env(cache))
        for k in ("MK_PREBUILT_DIR", "PYTHONPATH"):
            e.pop(k, None)
        ps = [subprocess.Popen([PY, script, str(r), uid], cwd=TMP, env=e, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for r in (0, 1, 2)]
        outs = [p.communicate(timeout=300)[0] for p in ps]
        for r, (p, o) in enumerate(zip(ps, outs)):
            self.assertEqual(p.returncode, 0, o)
            if r > 0:
                self.assertIn("rank %d exchange failed: mkRemoteError" % r, o)
                self.assertIn("rank %d refused: mkInvalidArgument" % r, o)
                self.assertIn("rank %d size 2 rank %d from one" % (r, r - 1), o)

    def test_two_nodes_span_nodes(self):
        # Two processes claiming two nodes (MK_HOST_ID): by default init fails
        # on both, naming the hosts; span_nodes="bootstrap" gives a
        # bootstrap-only communicator on both (what mkernel.torch's backend
        # hands to NCCL whole), whose collectives raise and whose bootstrap works.
        cache = os.path.join(TMP, "c-2n")
        script = os.path.join(TMP, "two_nodes.py")
        with open(script, "w") as f:
            f.write(ALLOC + textwrap.dedent("""
                import os, sys, time
                rank, uidfile = int(sys.argv[1]), sys.argv[2]
                def uid_for(n):
                    return shared_uid(rank, "%s.%d" % (uidfile, n))
                try:
                    mkernel.Communicator(2, rank, uid_for(0), device=rank)
                    print("rank", rank, "init succeeded")
                except mkernel.MkError as e:
                    print("rank", rank, "refused:", e.name, str(e))
                comm = mkernel.Communicator(2, rank, uid_for(1), device=rank, span_nodes="bootstrap")
                print("rank", rank, "nodes", comm.nodes, "bootstrap_only", comm.bootstrap_only)
                s = dalloc(4096, rank)
                try:
                    comm.all_reduce(s, s, 64, "fp32", "sum")
                    print("rank", rank, "all_reduce ran")
                except mkernel.MkError as e:
                    print("rank", rank, "all_reduce refused:", e.name, "bootstrap-only" in str(e))
                got = comm.bootstrap_broadcast(b"hello node b" if rank == 0 else b"x" * 12, root=0)
                comm.destroy()
                print("rank", rank, got.decode(), "ok")
            """))
        uid = os.path.join(TMP, "uid-2n")
        e = dict(os.environ)
        e.update(fake_env(cache))
        for k in ("MK_PREBUILT_DIR", "PYTHONPATH"):
            e.pop(k, None)
        ps = []
        for r in (0, 1):
            er = dict(e, MK_HOST_ID="node-%s" % "ab"[r])
            ps.append(subprocess.Popen([PY, script, str(r), uid], cwd=TMP, env=er, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=300)[0] for p in ps]
        for r, (p, o) in enumerate(zip(ps, outs)):
            self.assertEqual(p.returncode, 0, o)
            self.assertIn("rank %d refused: mkInvalidUsage" % r, o)
            self.assertIn("the ranks sit on 2 nodes", o)
            self.assertIn("rank %d nodes 2 bootstrap_only True" % r, o)
            self.assertIn("rank %d all_reduce refused: mkInvalidUsage True" % r, o)
            self.assertIn("rank %d hello node b ok" % r, o)

    def test_ranks_compiling_at_once_compile_each_plan_once(self):
        # Two threads prewarm the two ranks of one process at the same time:
        # the ranks share their plans, so each is compiled once (8 plans for
        # fp32 sum at 2 ranks: allreduce one_shot, one per rank (each holds
        # its rank's code path), and ring, and one for each other
        # collective), not once per rank.
        cache = os.path.join(TMP, "c-concurrent")
        p = py(ALLOC + """
            import threading
            comms = mkernel.Communicator.init_all([0, 1])
            ts = [threading.Thread(target=mkernel.prewarm, args=(c, ["fp32"])) for c in comms]
            for t in ts: t.start()
            for t in ts: t.join()
            for c in comms:
                c.destroy()
            print("PREWARMED")
        """, env=fake_env(cache, MK_PREBUILT_DIR=""))
        self.assertIn("PREWARMED", p.stdout)
        self.assertEqual(len(plans_in(cache)), 8, plans_in(cache))


if __name__ == "__main__":
    try:
        unittest.main(verbosity=2)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
