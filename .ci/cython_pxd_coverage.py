"""Cython's coverage plugin, made to report a .pxd the same way every time.

`.ci/coverage.sh` installs this module in its scratch environment, and
`[tool.coverage.run] plugins` in pyproject.toml names it.

The inline functions of a .pxd (the GCRA rule in _gcra.pxd) are compiled
into the .c of every module that cimports it. Cython.Coverage finds the .c
of a .pxd only if it has already read one that includes it while reporting
another file, and coverage asks for the files in the order of a set, which
the hash seed decides: `coverage report` failed with "did not provide a
file reporter for _gcra.pxd" under 4 seeds of 10, and the lines it counted
for the .pxd were those of whichever .c it had read last (and its
``_find_dep_file_path`` takes "_gcra.pxd", cited in _bucket_c.c, for
_bucket_c.pxd). Here a .pxd's executable lines are the union of those that
every .c beside it cites under its own name, so the report is the same
under any seed.
"""

import os

from coverage.files import canonical_filename
from Cython.Coverage import C_FILE_EXTENSIONS, CythonModuleReporter
from Cython.Coverage import Plugin as CythonPlugin


class Plugin(CythonPlugin):
    def file_reporter(self, filename):
        if os.path.splitext(filename)[1].lower() != ".pxd":
            return super().file_reporter(filename)
        filename = canonical_filename(os.path.abspath(filename))
        directory = os.path.dirname(filename)
        c_file = rel_file_path = None
        code = {}
        for name in sorted(os.listdir(directory)):
            if os.path.splitext(name)[1].lower() not in C_FILE_EXTENSIONS:
                continue
            path = os.path.join(directory, name)
            self._read_source_lines(path, filename)  # parses each .c once
            for included, lines in self._parsed_c_files[path].items():
                if filename.endswith(os.sep + os.path.normpath(included)):
                    c_file = c_file or path
                    rel_file_path = included
                    code.update(lines)
        if not code:
            return None
        return CythonModuleReporter(
            c_file,
            filename,
            rel_file_path,
            code,
            self._excluded_lines_map.get(rel_file_path, frozenset()),
        )


def coverage_init(reg, options):
    plugin = Plugin()
    reg.add_configurer(plugin)
    reg.add_file_tracer(plugin)
