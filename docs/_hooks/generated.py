"""An MkDocs hook: what the `nanobucket` commands print and draw, made at build time.

A page asks for a command's output with a line of its own:

    <!-- nanobucket simulate --plot img/simulate.png -->

The hook runs ``python -m nanobucket simulate --plot ...`` with this
checkout's ``src`` first on the path, puts what it printed in the page as a
console block, and adds the plot to the site at ``img/simulate.png``. So the
figures and the plots are always the code's own: none is committed.

A page that wants the picture without the printout (the home page) asks with
``<!-- nanobucket-plot simulate --plot img/simulate.png -->``: the command
runs (once for every page that asks for it), the marker leaves nothing, and
the page shows the plot with an image of its own.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

MARKER = re.compile(r"^<!-- nanobucket(?P<plot_only>-plot)? (?P<args>[^>]*?) -->$", re.MULTILINE)

_blocks: dict[str, str] = {}  # a marker's arguments -> the console block that replaces it


def _run(args: str, config: Any, files: Files) -> str:
    argv = shlex.split(args)
    shown = list(argv)
    root = Path(config.config_file_path).resolve().parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="nanobucket-docs-") as tmp:
        plot = None
        if "--plot" in argv:
            at = argv.index("--plot") + 1
            plot = argv[at]  # where the site serves it
            argv[at] = os.path.join(tmp, Path(plot).name)
            shown[at] = Path(plot).name
        done = subprocess.run(
            [sys.executable, "-m", "nanobucket", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            raise PluginError(f"`nanobucket {args}` failed:\n{done.stdout}{done.stderr}")
        out = done.stdout
        if plot is not None:
            out = out.replace(argv[at], shown[at])
            image = Path(argv[at]).read_bytes()
            files.append(File.generated(config, plot, content=image))
    return f"```console\n$ nanobucket {shlex.join(shown)}\n{out.rstrip()}\n```"


def on_files(files: Files, config: Any) -> Files:
    """Run every command a page asks for, once, and add the plots they draw."""
    _blocks.clear()
    for page in files.documentation_pages():
        if page.abs_src_path is None:
            continue
        for match in MARKER.finditer(Path(page.abs_src_path).read_text(encoding="utf-8")):
            if match["args"] not in _blocks:
                _blocks[match["args"]] = _run(match["args"], config, files)
    return files


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Each marker line becomes the console block of its command (a plot-only one, nothing)."""
    return MARKER.sub(lambda m: "" if m["plot_only"] else _blocks[m["args"]], markdown)
