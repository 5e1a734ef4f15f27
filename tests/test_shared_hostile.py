"""SharedKeyedTokenBucket against a hostile neighbour: planted, foreign, open or truncated files.

``/dev/shm`` is writable by every user. These tests play the other user with
root's powers (chown, chmod, setuid in a child) inside a temporary directory.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import pickle
import stat
import struct
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import pytest
from test_shared_procs import run_children

from nanobucket import shared
from nanobucket.shared import BadTableError, SharedKeyedTokenBucket

from conftest import NEEDS_SHARED_TABLE

pytestmark = NEEDS_SHARED_TABLE

as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="plays another user: needs root"
)
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and memfd")

OTHER_UID = 54321  # a user that owns nothing here
# Offsets of header fields (see shared.py).
CAPACITY_AT = 48
SLOTS_AT = 64
MAX_KEYS_AT = 72


@pytest.fixture
def path(tmp_path: Path) -> Path:
    SharedKeyedTokenBucket.create(path=tmp_path / "table", rate=1, capacity=3, max_keys=4).close()
    return tmp_path / "table"


def forge(path: Path, fields: dict[int, int]) -> None:
    """Rewrite header fields (offset: value) and recompute the check, as a forger can."""
    raw = bytearray(path.read_bytes())
    for offset, value in fields.items():
        struct.pack_into("=q", raw, offset, value)
    raw[112:120] = hashlib.blake2b(bytes(raw[:112]), digest_size=8).digest()
    path.write_bytes(raw)


# -- what open() attaches to --------------------------------------------------------


def test_open_refuses_a_symbolic_link(path: Path) -> None:
    link = path.with_name("planted")
    link.symlink_to(path)
    with pytest.raises(BadTableError, match=r"planted: is a symbolic link"):
        SharedKeyedTokenBucket.open(path=link)
    dangling = path.with_name("dangling")
    dangling.symlink_to(path.with_name("nowhere"))
    with pytest.raises(BadTableError, match="is a symbolic link"):
        SharedKeyedTokenBucket.open(path=dangling)
    with SharedKeyedTokenBucket.open(path=path) as t:  # the file itself is fine
        assert t.capacity == 3


@as_root
def test_open_refuses_a_file_owned_by_another_user(path: Path) -> None:
    os.chown(path, OTHER_UID, -1)
    with pytest.raises(BadTableError, match=rf"owned by uid {OTHER_UID}, not 0 "):
        SharedKeyedTokenBucket.open(path=path)


@as_root
def test_another_user_cannot_open_ours_and_is_told_why() -> None:
    # Without root's override the kernel refuses first (mode 0600); open()
    # still names the owner rather than a bare "Permission denied".
    with tempfile.TemporaryDirectory(dir=shared.default_directory()) as d:
        os.chmod(d, 0o755)  # where the other user can look (pytest's tmp_path is 0700)
        path = os.path.join(d, "table")
        SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1).close()

        def child(i: int) -> object:
            os.setresuid(OTHER_UID, OTHER_UID, OTHER_UID)
            try:
                SharedKeyedTokenBucket.open(path=path)
            except BadTableError as e:
                return str(e)
            return "opened"

        (message,) = run_children(1, child)
    assert message == (
        f"{path}: owned by uid 0, not {OTHER_UID} (this process's effective user); "
        "another user may have planted it"
    )


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602, 0o660])
def test_open_refuses_a_file_writable_by_group_or_others(path: Path, mode: int) -> None:
    os.chmod(path, mode)
    with pytest.raises(BadTableError, match=rf"writable by group or others \(mode {oct(mode)}\)"):
        SharedKeyedTokenBucket.open(path=path)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644, 0o400])
def test_open_accepts_owner_only_write(path: Path, mode: int) -> None:
    os.chmod(path, mode)
    with SharedKeyedTokenBucket.open(path=path) as t:
        assert t.allow_at("k", 0, cost=3) and not t.allow_at("k", 0)


def test_a_regular_file_check_comes_before_the_owner_check() -> None:
    # /dev/null is root's and 0666: what it is not is a file.
    with pytest.raises(BadTableError, match="not a regular file"):
        SharedKeyedTokenBucket.open(path="/dev/null")


# -- what create() makes ----------------------------------------------------------------


def test_create_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for target in (victim, tmp_path / "not-yet"):
        link = tmp_path / f"to-{target.name}"
        link.symlink_to(target)
        with pytest.raises(FileExistsError):
            SharedKeyedTokenBucket.create(path=link, rate=1, capacity=1)
        assert link.is_symlink()
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "not-yet").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["to-not-yet", "to-victim", "victim"]


@as_root
def test_create_refuses_a_name_another_user_took_first(tmp_path: Path) -> None:
    squat = tmp_path / "table"
    squat.write_bytes(b"")
    os.chown(squat, OTHER_UID, -1)
    with pytest.raises(FileExistsError):
        SharedKeyedTokenBucket.create(path=squat, rate=1, capacity=1)
    with pytest.raises(BadTableError, match="owned by uid"):  # and no worker attaches to it
        SharedKeyedTokenBucket.open(path=squat)


def test_create_makes_the_file_0600_and_refuses_modes_open_would_refuse(tmp_path: Path) -> None:
    with SharedKeyedTokenBucket.create(path=tmp_path / "t", rate=1, capacity=1) as t:
        info = os.stat(t.path)  # type: ignore[arg-type]  # a named table has a path
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, os.geteuid())
    for mode in (0o660, 0o606, 0o666):
        with pytest.raises(ValueError, match=rf"mode {oct(mode)} lets group or others write"):
            SharedKeyedTokenBucket.create(path=tmp_path / "u", rate=1, capacity=1, mode=mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


# -- headers and sizes ------------------------------------------------------------------


def test_a_header_claiming_more_slots_than_the_file_holds_is_refused(path: Path) -> None:
    forge(path, {SLOTS_AT: 1 << 42})
    with pytest.raises(
        BadTableError,
        match=r"truncated shared table: header says 4398046511104 slots but the file holds "
        r"256 bytes, not 70368744177792",
    ):
        SharedKeyedTokenBucket.open(path=path)


def test_a_truncated_file_is_refused(path: Path) -> None:
    os.truncate(path, 200)
    with pytest.raises(
        BadTableError, match=r"header says 8 slots but the file holds 200 bytes, not 256"
    ):
        SharedKeyedTokenBucket.open(path=path)


def test_a_forged_header_sized_to_match_is_refused_by_its_max_keys(path: Path) -> None:
    # A sparse file the header's size: 2**24 slots for a max_keys of 4 is not
    # a table create() makes, whatever the check says.
    forge(path, {SLOTS_AT: 1 << 24})
    os.truncate(path, 128 + (1 << 24) * 16)
    with pytest.raises(BadTableError, match="corrupt shared table header"):
        SharedKeyedTokenBucket.open(path=path)
    forge(path, {MAX_KEYS_AT: 1 << 23})  # now consistent: a real (sparse) table
    with SharedKeyedTokenBucket.open(path=path) as t:
        assert (t.slot_count, t.max_keys) == (1 << 24, 1 << 23)


@as_root
def test_the_checksum_catches_accidents_and_ownership_catches_forgers(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[CAPACITY_AT] ^= 1  # a flipped bit in the capacity
    path.write_bytes(raw)
    with pytest.raises(BadTableError, match="corrupt shared table header"):
        SharedKeyedTokenBucket.open(path=path)
    raw[CAPACITY_AT] ^= 1
    path.write_bytes(raw)
    forge(path, {CAPACITY_AT: 10**9})  # "no limit", the check recomputed: it passes...
    with SharedKeyedTokenBucket.open(path=path) as t:
        assert t.capacity == 10**9
    os.chown(path, OTHER_UID, -1)  # ...so what stops another user is who owns the file
    with pytest.raises(BadTableError, match="owned by uid"):
        SharedKeyedTokenBucket.open(path=path)


def test_attach_refuses_a_slot_count_past_its_mapping(path: Path) -> None:
    # 128 + 2**60 * 16 wraps to 128 in 64 bits: the slots must not be
    # trusted to index a 128-byte mapping.
    t = SharedKeyedTokenBucket.__new__(SharedKeyedTokenBucket)
    fd = os.open(path, os.O_RDWR)
    try:
        for size, slots in [(128, 1 << 60), (128 + 8 * 16, 16), (128 + 8 * 16 + 8, 8)]:
            with pytest.raises(ValueError, match="does not match the slot count"):
                t._attach(fd, size, 128, None, 1, 1, 10**9, slots, 4, 8, False, 1, 2, None)
    finally:
        os.close(fd)
    assert t.closed


# -- the anonymous table ----------------------------------------------------------------


def test_an_anonymous_table_is_shared_by_the_processes_forked_from_it() -> None:
    with SharedKeyedTokenBucket.create_anonymous(
        rate=Fraction(1, 3600), capacity=10, max_keys=100
    ) as t:
        assert (t.path, t.rate, t.capacity, t.max_keys, t.slot_count) == (
            None,
            Fraction(1, 3600),
            10,
            100,
            256,
        )
        assert t.allow_at("k", 0, cost=4)
        counts = run_children(4, lambda i: sum(t.allow_at("k", 0) for _ in range(5)))
        assert sum(counts) == 6  # 10 less the parent's 4, whichever child got them
        assert t.tokens_at("k", 0) == 0.0
        assert "anonymous" in repr(t)
        t.unlink()  # no file: nothing to do
        with pytest.raises(TypeError, match="fork"):
            pickle.dumps(t)
    assert t.closed


def test_anonymous_parameters_are_checked_like_create() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=0)
    with pytest.raises(ValueError, match="when_full"):
        SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=1, when_full="maybe")
    with pytest.raises(TypeError, match="clock"):
        SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=1, clock=5)  # type: ignore[arg-type]
    with SharedKeyedTokenBucket.create_anonymous(
        rate=1, capacity=2, max_keys=1, when_full="admit", clock=lambda: 0
    ) as t:
        assert (t.when_full, t.slot_count, t.allow("a"), t.allow("a"), t.allow("a")) == (
            "admit",
            2,
            True,
            True,
            False,
        )


F_SEAL_EXEC = 0x20  # Linux 6.3+: added by MFD_NOEXEC_SEAL


@linux
@pytest.mark.parametrize("kernel", ["current", "before 6.3"])
def test_the_anonymous_file_cannot_be_shrunk_or_grown(
    monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    if kernel == "before 6.3":  # no MFD_NOEXEC_SEAL: EINVAL, as an older kernel says
        memfd_create = os.memfd_create

        def old_memfd_create(name: str, flags: int) -> int:
            if flags & 8:
                raise OSError(errno.EINVAL, "Invalid argument")
            return memfd_create(name, flags)

        monkeypatch.setattr(os, "memfd_create", old_memfd_create)
    fd = shared._anonymous_file(4096)
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS) & ~F_SEAL_EXEC
        assert seals == fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        for size in (0, 8192):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, size)
        with pytest.raises(PermissionError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)  # nor sealed further
        assert os.fstat(fd).st_size == 4096
    finally:
        os.close(fd)


def _mappings(marker: str) -> set[str]:
    """The address ranges of this process's mappings whose name contains *marker*."""
    with open("/proc/self/maps") as maps:
        return {line.split()[0] for line in maps if marker in line}


def _mapping_of(marker: str, before: frozenset[str] = frozenset()) -> str:
    """The /proc/self/map_files entry of the one mapping whose name contains
    *marker* (not counting *before*: tables an earlier test left to the collector)."""
    found = sorted(_mappings(marker) - before)
    assert len(found) == 1, found
    return f"/proc/self/map_files/{found[0]}"


@linux
def test_even_the_same_user_cannot_truncate_an_anonymous_table_under_the_workers() -> None:
    with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2, max_keys=4) as t:
        try:  # the one way back to the file, for CAP_SYS_ADMIN only
            fd = os.open(_mapping_of("/memfd:nanobucket"), os.O_RDWR)
        except PermissionError:  # pragma: no cover - an unprivileged run
            pytest.skip("/proc/self/map_files needs CAP_SYS_ADMIN")
        try:
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)
        assert t.allow_at("k", 0, cost=2) and not t.allow_at("k", 0)


@linux
def test_without_memfd_the_anonymous_table_is_an_unlinked_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(os, "memfd_create")
    before = frozenset(_mappings("/.nanobucket-"))
    with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=3, max_keys=4) as t:
        mapping = _mapping_of("/.nanobucket-", before)
        assert os.readlink(mapping).endswith(" (deleted)")
        counts = run_children(2, lambda i: sum(t.allow_at("k", 0) for _ in range(3)))
        assert sum(counts) == 3


def test_without_the_extension_create_anonymous_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "_Base", None)  # as on a pure-Python install
    with pytest.raises(RuntimeError, match="Cython extension"):
        SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=1)
