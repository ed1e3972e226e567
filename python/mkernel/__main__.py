"""`python -m mkernel ARGS...` is `mkc ARGS...`."""
import os
import sys

from . import _lib


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    exe = _lib.mkc_path()
    if not os.path.exists(exe):
        sys.stderr.write("mkernel: mkc not found at %s (set MK_MKC, or reinstall the package)\n" % exe)
        return 127
    os.execv(exe, [exe] + list(argv))


if __name__ == "__main__":
    sys.exit(main())
