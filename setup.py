"""Builds the Cython extension; everything else is in pyproject.toml.

NANOBUCKET_NO_EXTENSIONS=1  a pure-Python install (no compiler needed)
NANOBUCKET_REQUIRE_EXTENSIONS=1  fail when the extensions cannot be compiled
                            (without it, a build with no working C compiler
                            installs the pure-Python twin, with one warning)
NANOBUCKET_DEBUG_BUILD=1    -O0 -g and C asserts, for gdb and sanitizers
NANOBUCKET_SANITIZE=1       -fsanitize=address,undefined (implies the debug build)
NANOBUCKET_CYTHON_TRACE=1   Cython line tracing, so coverage can see the .pyx
NANOBUCKET_WERROR=1         compiler warnings (-Wall, always on) are errors (CI)
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

NO_EXTENSIONS = os.environ.get("NANOBUCKET_NO_EXTENSIONS", "") not in ("", "0")
SANITIZE = os.environ.get("NANOBUCKET_SANITIZE", "") not in ("", "0")
DEBUG = SANITIZE or os.environ.get("NANOBUCKET_DEBUG_BUILD", "") not in ("", "0")
TRACE = os.environ.get("NANOBUCKET_CYTHON_TRACE", "") not in ("", "0")
REQUIRE = os.environ.get("NANOBUCKET_REQUIRE_EXTENSIONS", "") not in ("", "0")
WERROR = os.environ.get("NANOBUCKET_WERROR", "") not in ("", "0")
MODULES = ["_core._bucket_c", "bench._floor", "_core._shared_c"]
if sys.platform == "win32":
    MODULES.remove("_core._shared_c")  # POSIX mmap; shared.py raises a clear error without it


def extensions():
    from Cython.Build import cythonize

    compile_args, link_args, macros = [], [], []
    if sys.platform != "win32":
        compile_args = ["-O0", "-g3", "-UNDEBUG"] if DEBUG else ["-O3"]
        compile_args += ["-Wall", "-Werror"] if WERROR else ["-Wall"]
    if SANITIZE:
        compile_args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
        link_args += ["-fsanitize=address,undefined"]
    if TRACE:
        macros += [("CYTHON_TRACE_NOGIL", "1")]
    exts = [
        Extension(
            f"nanobucket.{name}",
            [f"src/nanobucket/{name.replace('.', '/')}.pyx"],
            include_dirs=["src/nanobucket/_core"],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
            define_macros=macros,
        )
        for name in MODULES
    ]
    # "clinic": signatures as __text_signature__, which inspect.signature and help() read.
    directives = {"embedsignature": True, "embedsignature.format": "clinic", "binding": False,
                  "linetrace": TRACE}
    return cythonize(exts, compiler_directives=directives, language_level=3)


class OptionalBuildExt(build_ext):
    """Without a working C compiler, build nothing and say so once (as aiohttp and yarl do)."""

    def run(self):
        if self.extensions:
            # The C compiler prints nothing for about a minute: say what is happening first.
            print("*** nanobucket: compiling nanobucket's C extensions (about a minute)... ***",
                  file=sys.stderr, flush=True)
        try:
            super().run()
        except (CCompilerError, ExecError, PlatformError, OSError) as exc:
            if REQUIRE:
                raise
            self.extensions = []  # the wheel holds the pure-Python twin alone
            print(
                f"*** WARNING: nanobucket's C extensions could not be compiled "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); "
                "installing the pure-Python twin (the same semantics, several times slower). "
                "Install a C compiler and the Python headers for the fast build, or set "
                "NANOBUCKET_REQUIRE_EXTENSIONS=1 to make this an error. ***",
                file=sys.stderr,
            )


ext_modules = [] if NO_EXTENSIONS else extensions()
print(f"*** nanobucket: {'pure Python' if NO_EXTENSIONS else 'Cython'} build"
      f"{' (debug)' if DEBUG else ''}{' (sanitized)' if SANITIZE else ''}"
      f"{' (line tracing)' if TRACE else ''} ***", file=sys.stderr)
setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
