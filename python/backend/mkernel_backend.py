"""mKernel's PEP 517 build backend: standard library only (pyproject.toml has
`requires = []`), so `pip install .` and `pip wheel .` work with no network.

It builds the native parts with CMake + Ninja (or takes a build tree that has
them), compiles the shipped plans with `mkc prebuild`, and writes one
`py3-none-manylinux_<glibc>_<arch>` wheel: the Python package binds
libmkernel.so.0 through ctypes, so the wheel serves every CPython 3.

Settings (pip's `-C key=value` / `--config-settings`, or the environment):
  build-dir   MK_WHEEL_BUILD_DIR  a CMake build tree that holds libmkernel.so.0,
                                  mkc and nccl/libnccl.so.2 (default: build
                                  build-wheel/ here with CMake + Ninja)
  prebuilt    MK_WHEEL_PREBUILT   "default" (sm_80,sm_90; 1,2,4,8 ranks; bf16,
                                  fp16, fp32 sum; int32/int64 for the
                                  collectives that move data), "none", or a directory
                                  written by `mkc prebuild`
  jobs        MK_WHEEL_JOBS       parallel compile jobs (default: all cores)
  cmake-args  MK_WHEEL_CMAKE_ARGS extra arguments for the CMake configure step
"""
import base64
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

NAME = "mkernel"
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_DEFAULT_PREBUILT = ["--arch", "sm_80,sm_90", "--ranks", "1,2,4,8", "--dtype", "bf16,fp16,fp32", "--op", "sum"]


def _version():
    # project(mkernel VERSION x.y.z ...) in CMakeLists.txt is the one version
    with open(os.path.join(SRC, "CMakeLists.txt")) as f:
        for line in f:
            if line.startswith("project(mkernel VERSION "):
                return line.split()[2]
    raise RuntimeError("mkernel_backend: no version in CMakeLists.txt")


def _setting(cs, key, env, default=None):
    if cs and key in cs and cs[key] not in (None, ""):
        return cs[key]
    v = os.environ.get(env)
    return v if v else default


def _log(msg):
    sys.stderr.write("mkernel_backend: %s\n" % msg)
    sys.stderr.flush()


def _run(cmd, **kw):
    _log("$ " + " ".join(shlex.quote(str(c)) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def _jobs(cs):
    return int(_setting(cs, "jobs", "MK_WHEEL_JOBS", os.cpu_count() or 1))


def _have_nccl_h():
    # CMake builds the NCCL-compatible library only where nccl.h is (CMakeLists.txt)
    root = os.environ.get("MK_CUDA_ROOT", "/usr/local/cuda")
    return os.path.isfile(os.path.join(root, "include", "nccl.h"))


def _native(cs):
    """The build tree holding the native files (built here if not given)."""
    given = _setting(cs, "build-dir", "MK_WHEEL_BUILD_DIR")
    need = ["libmkernel.so.0", "mkc"]
    if given:
        b = os.path.abspath(given)
        missing = [n for n in need if not os.path.exists(os.path.join(b, n))]
        if missing:
            raise RuntimeError("mkernel_backend: build-dir %s lacks %s (build it with scripts/build.sh, or leave "
                               "build-dir unset to build here)" % (b, ", ".join(missing)))
        return b
    b = os.path.join(SRC, "build-wheel")
    if not os.path.exists(os.path.join(b, "build.ninja")):
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        extra = shlex.split(_setting(cs, "cmake-args", "MK_WHEEL_CMAKE_ARGS", ""))
        _run(["cmake", "-S", SRC, "-B", b] + gen + ["-DCMAKE_BUILD_TYPE=Release", "-DMK_BUILD_TESTS=OFF"] + extra)
    targets = ["mkernel", "mkc"] + (["mkernel_nccl"] if _have_nccl_h() else [])
    if not _have_nccl_h():
        _log("no nccl.h under MK_CUDA_ROOT: the wheel has no NCCL-compatible library (and no mkernel-run)")
    _run(["cmake", "--build", b, "--parallel", str(_jobs(cs)), "--target"] + targets)
    return b


def _prebuilt(cs, build):
    """A prebuilt-plan directory to ship, or None."""
    what = _setting(cs, "prebuilt", "MK_WHEEL_PREBUILT", "default")
    if what == "none":
        return None
    if what != "default":
        d = os.path.abspath(what)
        if not os.path.isfile(os.path.join(d, "index.json")):
            raise RuntimeError("mkernel_backend: prebuilt=%s has no index.json (write it with `mkc prebuild`)" % d)
        return d
    out = os.path.join(build, "prebuilt")
    env = dict(os.environ)
    # a kernel cache of the build's own, so a rebuild recompiles only what changed
    env["MK_CACHE_DIR"] = os.path.join(build, "kernel-cache")
    env["MK_PREBUILT_DIR"] = ""  # compile everything: take nothing from an installed package
    if os.path.isdir(out):
        shutil.rmtree(out)
    _run([os.path.join(build, "mkc"), "prebuild"] + _DEFAULT_PREBUILT + ["--jobs", str(_jobs(cs)), "-o", out], env=env)
    return out


def _platform_tag():
    libc, ver = platform.libc_ver()
    if libc != "glibc" or not ver:
        raise RuntimeError("mkernel_backend: needs glibc (found %r)" % (libc or "none"))
    major, minor = ver.split(".")[:2]
    # the binaries need this machine's glibc at most: the tag says exactly that
    return "manylinux_%s_%s_%s" % (major, minor, platform.machine())


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arc, digest, len(data))


def _metadata(version):
    readme = ""
    try:
        with open(os.path.join(SRC, "README.md"), encoding="utf-8") as f:
            readme = f.read()
    except OSError:
        pass
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
            "Summary: GPU collective communication compiled into fused CUDA kernels (NCCL-compatible)\n"
            "Requires-Python: >=3.8\n"
            "Description-Content-Type: text/markdown\n\n%s" % (NAME, version, readme))


def _dist_info_files(version, tag):
    wheel = ("Wheel-Version: 1.0\nGenerator: mkernel_backend\nRoot-Is-Purelib: false\nTag: py3-none-%s\n" % tag)
    entry = "[console_scripts]\nmkc = mkernel.__main__:main\nmkernel-run = mkernel._run:main\n"
    return {"METADATA": _metadata(version), "WHEEL": wheel, "entry_points.txt": entry}


def _package_files(build, prebuilt):
    """(archive name, source path, executable) of every file of the package."""
    files = []
    pkg = os.path.join(SRC, "python", NAME)
    for root, dirs, names in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for n in sorted(names):
            if n.endswith(".py"):
                p = os.path.join(root, n)
                files.append((NAME + "/" + os.path.relpath(p, pkg).replace(os.sep, "/"), p, False))
    files += [
        (NAME + "/lib/libmkernel.so.0", os.path.join(build, "libmkernel.so.0"), False),
        (NAME + "/bin/mkc", os.path.join(build, "mkc"), True),
        (NAME + "/include/mk.h", os.path.join(SRC, "include", "mk.h"), False),
        # the built-in selection table, in MK_SELECT_FILE's format (docs/select.md)
        (NAME + "/share/mkernel/select.json", os.path.join(SRC, "runtime", "plans", "select_builtin.json"), False),
    ]
    shim = os.path.join(build, "nccl", "libnccl.so.2")
    if os.path.isfile(shim):  # built where nccl.h is
        files += [(NAME + "/lib/mkernel/nccl/libnccl.so.2", shim, False),
                  (NAME + "/bin/mkernel-run", os.path.join(SRC, "tools", "mkernel-run"), True)]
    for n in sorted(os.listdir(os.path.join(SRC, "include", "mk"))):
        files.append((NAME + "/include/mk/" + n, os.path.join(SRC, "include", "mk", n), False))
    if prebuilt:
        for root, dirs, names in os.walk(prebuilt):
            dirs.sort()
            for n in sorted(names):
                if n.endswith(".tmp"):
                    continue
                p = os.path.join(root, n)
                rel = os.path.relpath(p, prebuilt).replace(os.sep, "/")
                files.append((NAME + "/share/mkernel/prebuilt/" + rel, p, False))
    return files


def _write_wheel(wheel_directory, files, version, tag):
    dist = "%s-%s.dist-info" % (NAME, version)
    name = "%s-%s-py3-none-%s.whl" % (NAME, version, tag)
    path = os.path.join(wheel_directory, name)
    records = []
    tmp = path + ".part"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        def add(arc, data, executable):
            info = zipfile.ZipInfo(arc, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = ((0o755 if executable else 0o644) | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            records.append(_record_line(arc, data))

        for arc, src, exe in files:
            with open(src, "rb") as f:
                add(arc, f.read(), exe)
        for n, text in _dist_info_files(version, tag).items():
            add(dist + "/" + n, text.encode("utf-8"), False)
        records.append(dist + "/RECORD,,")
        info = zipfile.ZipInfo(dist + "/RECORD", date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = (0o644 | 0o100000) << 16
        z.writestr(info, "\n".join(records) + "\n")
    os.replace(tmp, path)
    return name


# ---- PEP 517 hooks ------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    version = _version()
    dist = "%s-%s.dist-info" % (NAME, version)
    d = os.path.join(metadata_directory, dist)
    os.makedirs(d, exist_ok=True)
    for n, text in _dist_info_files(version, _platform_tag()).items():
        with open(os.path.join(d, n), "w", encoding="utf-8") as f:
            f.write(text)
    return dist


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build = _native(config_settings)
    prebuilt = _prebuilt(config_settings, build)
    name = _write_wheel(wheel_directory, _package_files(build, prebuilt), _version(), _platform_tag())
    _log("wrote %s" % os.path.join(wheel_directory, name))
    return name


def build_sdist(sdist_directory, config_settings=None):
    version = _version()
    base = "%s-%s" % (NAME, version)
    try:
        # tracked files and new ones not ignored (what a commit would hold)
        listed = subprocess.run(["git", "-C", SRC, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                check=True, stdout=subprocess.PIPE).stdout
        names = [n for n in listed.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        raise RuntimeError("mkernel_backend: an sdist is made from a git checkout (git ls-files)") from None
    name = base + ".tar.gz"
    with tempfile.TemporaryDirectory() as t:
        tmp = os.path.join(t, name)
        with tarfile.open(tmp, "w:gz") as tar:
            for n in names:
                p = os.path.join(SRC, n)
                if os.path.isfile(p):
                    tar.add(p, arcname=base + "/" + n, recursive=False)
            pkg_info = os.path.join(t, "PKG-INFO")
            with open(pkg_info, "w", encoding="utf-8") as f:
                f.write(_metadata(version))
            tar.add(pkg_info, arcname=base + "/PKG-INFO")
        shutil.move(tmp, os.path.join(sdist_directory, name))
    return name
