"""One keyed limit for every worker process of a machine: a table in shared memory.

A pre-fork server (gunicorn, uWSGI, a ``multiprocessing`` pool) with a bucket
per worker admits about N times its limit. ``SharedKeyedTokenBucket`` keeps
the buckets in a file mapped by every worker (under ``/dev/shm`` by default),
lock-free: each 16-byte slot is changed only by compare-and-swap, so a
worker killed or stopped at any instant leaves no held lock and no torn state.
The semantics and verbs are those of ``KeyedTokenBucket``.

>>> t = SharedKeyedTokenBucket.create("api-limit", rate=100, capacity=200)  # doctest: +SKIP
>>> t.allow("alice")                                                        # doctest: +SKIP
True

It needs the Cython extension (``_shared_c``): on a pure-Python install
(``NANOBUCKET_NO_EXTENSIONS=1`` or non-CPython) ``create`` and ``open``
raise ``RuntimeError``.

The examples of this module and of the table's methods make their files in
``tmp_dir``, a scratch directory (``tempfile.mkdtemp()``, say), and take
``os`` as imported.

File layout (native byte order; the file is only shared on one machine):
a 128-byte header, then ``slot_count`` 16-byte slots of two int64 words
(key fingerprint, GCRA tat; see ``_shared_c`` for their states). The header
holds, as 8-byte fields: magic, byte-order mark, layout version, header
size, the rate as an exact fraction (numerator, denominator), capacity,
interval_ns, slot count, max_keys, probe length, the full-window policy, the
128-bit hash seed, a BLAKE2b check of the fields before it (against
accidents, not forgery: see ``open``), and last the table's one shared
variable, the reclaim horizon (0 in a new file).

``/dev/shm`` is writable by every user, so ``open`` attaches only to a
regular file (never a symbolic link) owned by the effective user and
writable by nobody else, whose size is the header's. What then remains is
the same user: another of its processes can truncate or rewrite a named
table. ``SharedKeyedTokenBucket.create_anonymous`` leaves nothing to find
or truncate: a table with no name, inherited across ``fork``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
import struct
import tempfile
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ._compose.verbs import Reserving
from ._core._params import (
    Clock,
    RateArg,
    bucket_params,
    public_rate,
    stored_rate,
    validated_clock,
    validated_flag,
    validated_max_keys,
)

__all__ = ("BadTableError", "SharedKeyedTokenBucket", "default_directory")

MAGIC = b"NBSHMKT\x00"
BYTE_ORDER_MARK = 0x0102030405060708
LAYOUT_VERSION = 2  # 2: 63-bit fingerprints, claims, the horizon word
HEADER_SIZE = 128
SLOT_SIZE = 16
# Slots a key may live in: bounds every lookup. Measured by linear probing at
# exactly half full (6,000 tables of 2**20 keys): 3.5e-5 of keys sit 24 or
# more slots from home, 4.2e-6 32 or more, 2.2e-9 64 or more (so a window of
# 64 refused some key in 1 table of 550), falling 5-7 fold per 8 slots (the
# theory's limit: e**(-0.19 per slot)). With 128, about 1e-14 per key.
# Lookups stop at the first empty slot, so a long window costs nothing until
# a cluster needs it.
PROBE = 128
DEFAULT_MAX_KEYS = 100_000  # a 4 MiB file
WHEN_FULL = ("reject", "admit")
INT64_MAX = (1 << 63) - 1
#: Rounds of `open_or_create` (open, else create; replace another limit's table)
#: before it gives up: each lost only to another process's replacement.
OPEN_OR_CREATE_TRIES = 100

# magic, bom, version, header size, rate num, rate den, capacity, interval_ns,
# slot count, max_keys, probe, when_full, seed0, seed1; then check, horizon.
_FIELDS = struct.Struct("=8sQQQqqqqqqqqQQ")
_CHECKED = _FIELDS.size  # 112 bytes covered by the check
_CHECK = struct.Struct("=8s8x")  # at 112: the check, then the horizon (shared state, unchecked)


if TYPE_CHECKING:  # _shared_c.pyi types the extension
    from ._core._shared_c import SharedTable as _Base
else:
    try:
        from ._core._shared_c import SharedTable as _Base
    except ImportError:  # pragma: no cover - a pure-Python install
        _Base = None


class BadTableError(ValueError):
    """The file is not a usable shared table: foreign, damaged, another version, or unsafe.

    A ``ValueError``, raised by `SharedKeyedTokenBucket.open`. Unsafe means
    a file another user could have planted or can rewrite: a symbolic link,
    a file owned by another user, or one writable by group or others. The
    message names the reason.

    >>> import pathlib
    >>> notes = pathlib.Path(tmp_dir, "notes.txt")
    >>> n = notes.write_text("not a table" * 20)
    >>> SharedKeyedTokenBucket.open(path=notes)
    Traceback (most recent call last):
    ...
    nanobucket.shared.BadTableError: ...notes.txt: not a nanobucket shared table
    """


def default_directory() -> str:
    """Where tables named without a path live: ``/dev/shm`` (RAM), else the temp dir.

    >>> import os
    >>> os.path.isdir(default_directory())
    True
    """
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _resolve(name: str | None, path: str | os.PathLike[str] | None) -> str:
    if (name is None) == (path is None):
        raise TypeError("give exactly one of name (a file under /dev/shm) or path=")
    if path is not None:
        return os.fspath(path)
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"name must be a plain file name (no '/'), got {name!r}")
    return os.path.join(default_directory(), name)


def _slot_count(max_keys: int) -> int:
    # At most half full: linear-probe runs stay short, so a window of PROBE
    # slots holding only live buckets is rare before max_keys is reached.
    n = 2
    while n < 2 * max_keys:
        n *= 2
    return n


def _header(fields: tuple[Any, ...]) -> bytes:
    body = _FIELDS.pack(*fields)
    return body + _CHECK.pack(hashlib.blake2b(body, digest_size=8).digest())


def _validated_mode(mode: object) -> None:
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise ValueError(f"mode must be a permission int such as 0o600, got {mode!r}")
    if mode & 0o022:
        raise ValueError(
            f"mode {oct(mode)} lets group or others write the table, which open() "
            "refuses; give at most 0o644"
        )


def _limit(
    rate: RateArg, capacity: int | None, max_keys: int, when_full: str
) -> tuple[Fraction, int, int, int]:
    """A table's limit, checked: ``(exact rate, capacity, interval_ns, max_keys)``."""
    exact, cap, interval, _tau = bucket_params(rate, capacity)
    keys = validated_max_keys(max_keys)
    if when_full not in WHEN_FULL:
        raise ValueError(f"when_full must be 'reject' or 'admit', got {when_full!r}")
    if exact.numerator > INT64_MAX or exact.denominator > INT64_MAX:
        raise ValueError(f"rate {rate!r} is too fine a fraction to store (num/den > 2**63)")
    return exact, cap, interval, keys


def _require_extension() -> None:
    if _Base is None:
        raise RuntimeError(
            "SharedKeyedTokenBucket needs nanobucket's Cython extension, which this "
            "install does not have (pure-Python build or NANOBUCKET_NO_EXTENSIONS)"
        )


class _Missing:
    """Stands in for the extension type on a pure-Python install."""


if TYPE_CHECKING:
    _Table = _Base
else:  # the class statement must run on a pure-Python install too
    _Table = _Base if _Base is not None else _Missing


class SharedKeyedTokenBucket(_Table, Reserving):
    """A ``KeyedTokenBucket`` in shared memory: one limit for all processes mapping it.

    Make one with ``create`` (before the workers fork, or in one of them) and
    attach with ``open`` (or just inherit it across ``fork``), or make one
    with no name with ``create_anonymous`` before the workers fork. Keys are
    ``str`` (hashed as UTF-8), ``bytes``, or ``int`` (hashed as 8-byte
    little-endian two's complement when in int64 range, else as its minimal
    two's complement bytes); ``"1"``, ``b"1"`` and ``1`` are different keys.
    Other types raise ``TypeError``, and so does None unless the handle is
    made with ``none_key=True`` (as ``KeyedTokenBucket`` refuses it: it is
    what a key function returns for a missing value).

    The table holds ``max_keys`` keys at most half-full; a key lives in one of
    128 slots, and a new key takes an empty slot or reclaims one whose bucket
    is full (lossless: a full bucket and a missing key are the same state).
    ``max_keys`` live keys all fit but with odds of about 1e-14 per key.
    When all 128 hold live buckets, ``when_full="reject"`` (the default: fail
    closed) refuses the new key until one fills up, with ``retry_after`` set
    to that moment; ``"admit"`` (fail open) admits it without tracking it.

    >>> path = os.path.join(tmp_dir, "demo")   # or create("demo", ...): /dev/shm/demo
    >>> with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=2) as t:
    ...     [t.allow_at("alice", 0) for _ in range(3)]
    [True, True, False]
    """

    keyed = True  # the verbs take the key first

    # (st_dev, st_ino) of a named table's file: `unlink` removes the name only while it is this
    # table's (`open_or_create` may have put another there since).
    __slots__ = ("_file",)
    _file: tuple[int, int] | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(
            "use SharedKeyedTokenBucket.create(...) or SharedKeyedTokenBucket.open(...)"
        )

    @classmethod
    def create(
        cls,
        name: str | None = None,
        *,
        rate: RateArg,
        capacity: int | None = None,
        max_keys: int = DEFAULT_MAX_KEYS,
        path: str | os.PathLike[str] | None = None,
        mode: int = 0o600,
        when_full: str = "reject",
        clock: Clock | None = None,
        none_key: bool = False,
    ) -> SharedKeyedTokenBucket:
        """Create a new table file (``FileExistsError`` if it exists) and attach to it.

        *name* is a file under ``/dev/shm``; or give ``path=``. The file
        appears complete or not at all: it is built under a random name
        (created exclusively, never through a symbolic link, mode 0600),
        then linked in, which fails on anything already at the name, a
        symbolic link included. *mode* may add read access for group or
        others, never write access (``open`` refuses such a file).

        A named table is as safe as its file: ``open`` refuses files another
        user could have planted or can write, but another process of the
        same user can still truncate the file (every process attached then
        dies of SIGBUS on its next touch) or rewrite it, and anyone who can
        write the directory can take the name first (``create`` then fails).
        `create_anonymous` has no name and cannot be truncated.

        >>> path = os.path.join(tmp_dir, "api")   # or create("api", ...): /dev/shm/api
        >>> with SharedKeyedTokenBucket.create(path=path, rate=100, capacity=200) as t:
        ...     t.rate, t.capacity, t.max_keys, t.when_full
        (100, 200, 100000, 'reject')
        """
        _require_extension()
        target = _resolve(name, path)
        _validated_mode(mode)
        return cls._create(target, rate, capacity, max_keys, mode, when_full, clock, none_key)

    @classmethod
    def create_anonymous(
        cls,
        *,
        rate: RateArg,
        capacity: int | None = None,
        max_keys: int = DEFAULT_MAX_KEYS,
        when_full: str = "reject",
        clock: Clock | None = None,
        none_key: bool = False,
    ) -> SharedKeyedTokenBucket:
        """Create a table with no name, shared with the processes this one forks afterwards.

        Make it in the parent of a pre-fork pool (gunicorn's ``on_starting``)
        and the workers inherit the mapping. No other process can find it,
        take its name or truncate it: on Linux it lives in a ``memfd``
        sealed against shrinking and growing, elsewhere in a file unlinked
        as soon as it is made. Its ``path`` is ``None``; it cannot be
        ``open``ed, pickled or passed to a process that was not forked from
        this one (``multiprocessing``'s "spawn" and "forkserver" contexts).

        >>> import os
        >>> with SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2) as t:
        ...     pid = os.fork()
        ...     if pid == 0:                     # a worker: the same buckets
        ...         os._exit(t.allow_at("alice", 0, cost=2))
        ...     _, status = os.waitpid(pid, 0)
        ...     os.waitstatus_to_exitcode(status), t.allow_at("alice", 0), t.path
        (1, False, None)
        """
        _require_extension()
        return cls._create(None, rate, capacity, max_keys, 0o600, when_full, clock, none_key)

    @classmethod
    def _create(
        cls,
        target: str | None,
        rate: RateArg,
        capacity: int | None,
        max_keys: int,
        mode: int,
        when_full: str,
        clock: Clock | None,
        none_key: bool,
        *,
        replace: bool = False,
    ) -> SharedKeyedTokenBucket:
        """Build a table in a new file linked in at *target* (or, with *replace*, renamed
        over the file there), or in an anonymous one (None)."""
        exact, cap, interval, keys = _limit(rate, capacity, max_keys, when_full)
        validated_clock(clock)
        validated_flag(none_key, "none_key")
        slots = _slot_count(keys)
        probe = min(PROBE, slots)
        seed0, seed1 = struct.unpack("=QQ", secrets.token_bytes(16))
        header = _header(
            (
                MAGIC,
                BYTE_ORDER_MARK,
                LAYOUT_VERSION,
                HEADER_SIZE,
                exact.numerator,
                exact.denominator,
                cap,
                interval,
                slots,
                keys,
                probe,
                WHEN_FULL.index(when_full),
                seed0,
                seed1,
            )
        )
        size = HEADER_SIZE + slots * SLOT_SIZE
        tmp = ""  # a named table's file, under its temporary name
        if target is None:
            fd = _anonymous_file(size)
        else:
            # mkstemp: O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600, a random name.
            fd, tmp = tempfile.mkstemp(prefix=".nanobucket-", dir=os.path.dirname(target) or ".")
        try:
            if target is not None:
                os.fchmod(fd, mode)
                _reserve(fd, size)
            os.pwrite(fd, header, 0)
            table = cls.__new__(cls)
            info = os.fstat(fd)
            table._file = None if target is None else (info.st_dev, info.st_ino)
            table._attach(
                fd,
                size,
                HEADER_SIZE,
                target,
                public_rate(rate, exact),
                cap,
                interval,
                slots,
                keys,
                probe,
                when_full == "admit",
                seed0,
                seed1,
                clock,
                none_key,
            )
            if target is not None and replace:
                # Atomic: a process opening the name finds the old table or this one.
                os.rename(tmp, target)
                tmp = ""
            elif target is not None:
                # Atomic and exclusive: FileExistsError if anything is at the
                # name, a symbolic link included (link never follows one).
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    raise FileExistsError(
                        errno.EEXIST,
                        "a file is already at the name (open() attaches to its table and "
                        "its limit; open_or_create() to apply this limit, replacing a table "
                        "of another)",
                        target,
                    ) from None
        finally:
            os.close(fd)
            if tmp:
                os.unlink(tmp)
        return table

    @classmethod
    def open(
        cls,
        name: str | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        clock: Clock | None = None,
        none_key: bool = False,
    ) -> SharedKeyedTokenBucket:
        """Attach to an existing table; rate, capacity and the rest come from its header.

        *none_key* is this handle's own: whether its verbs take None as a key
        (every handle that does reaches the same bucket).

        Raises ``BadTableError`` (a ``ValueError``) for a file that is not
        such a table, is truncated or corrupt, or has another layout version;
        and, since ``/dev/shm`` is writable by every user, for a symbolic
        link, a file not owned by this process's effective user, or one
        writable by group or others: another user could have planted it
        (say, a table with no limit) or could truncate it under the workers.
        The header's checksum only catches accidents (a foreign or damaged
        file); it is no seal against forgery, which ownership and mode are.

        >>> path = os.path.join(tmp_dir, "api")
        >>> with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=2) as a:
        ...     with SharedKeyedTokenBucket.open(path=path) as b:   # as another worker would
        ...         a.allow_at("alice", 0), b.allow_at("alice", 0), b.allow_at("alice", 0)
        (True, True, False)
        """
        _require_extension()
        target = _resolve(name, path)
        fd = _open_file(target)
        try:
            info, fields = _read_table(target, fd)
            validated_clock(clock)
            validated_flag(none_key, "none_key")
            return cls._attached(fd, target, info, fields, clock, none_key)
        finally:
            os.close(fd)

    @classmethod
    def open_or_create(
        cls,
        name: str | None = None,
        *,
        rate: RateArg,
        capacity: int | None = None,
        max_keys: int = DEFAULT_MAX_KEYS,
        path: str | os.PathLike[str] | None = None,
        mode: int = 0o600,
        when_full: str = "reject",
        clock: Clock | None = None,
        none_key: bool = False,
    ) -> SharedKeyedTokenBucket:
        """Attach to the table at the name if it holds this limit, else put one that does there.

        What a process that states its limit calls (each worker of a release,
        a master before it forks), so a limit changed in code applies once
        deployed, with no file to remove by hand:

        - nothing at the name: a table is created, as `create` makes it (of
          several processes at once, one creates it and the others attach);
        - a table of this rate, capacity, ``max_keys`` and ``when_full``:
          attached, as `open` does (its buckets as they are);
        - a table of another: a new table of this limit replaces it at the
          name in one step (a rename, one process at a time), every key
          full. Processes attached to the old table keep it, under the old
          limit, until they attach again (by name: to the new one); their
          table never changes or shrinks under them. Buckets are not carried
          over: a key starts full once under the new limit.

        A file at the name that `open` refuses (not a table, damaged, another
        layout version, unsafe) raises `BadTableError` and is left alone.

        >>> path = os.path.join(tmp_dir, "limits")
        >>> with SharedKeyedTokenBucket.open_or_create(path=path, rate=1, capacity=2) as old:
        ...     with SharedKeyedTokenBucket.open_or_create(path=path, rate=2, capacity=4) as new:
        ...         [old.allow_at("alice", 0) for _ in range(3)], new.tokens_at("alice", 0)
        ([True, True, False], 4.0)
        >>> with SharedKeyedTokenBucket.open(path=path) as t:   # the name holds the new limit
        ...     t.capacity
        4
        """
        _require_extension()
        target = _resolve(name, path)
        _validated_mode(mode)
        exact, cap, _interval, keys = _limit(rate, capacity, max_keys, when_full)
        wanted = (exact.numerator, exact.denominator, cap, keys, WHEN_FULL.index(when_full))
        validated_clock(clock)
        validated_flag(none_key, "none_key")
        made = (target, rate, capacity, max_keys, mode, when_full, clock, none_key)
        for _ in range(OPEN_OR_CREATE_TRIES):
            try:
                fd = _open_file(target)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):  # another process made it: open it
                    return cls._create(*made)
                continue
            try:
                info, fields = _read_table(target, fd)
                num, den, has_cap, has_keys, policy = (fields[i] for i in (4, 5, 6, 9, 11))
                if (num, den, has_cap, has_keys, policy) == wanted:
                    return cls._attached(fd, target, info, fields, clock, none_key)
                import fcntl  # POSIX only: here, so that the package still imports on Windows

                # One replacer at a time (the lock is the old file's, dropped with fd):
                # a process that waited finds the name moved and attaches to the new table.
                fcntl.flock(fd, fcntl.LOCK_EX)
                if _still_at(target, info):
                    return cls._create(*made, replace=True)
            finally:
                os.close(fd)
        raise BlockingIOError(
            f"{target}: replaced by other processes {OPEN_OR_CREATE_TRIES} times in a row; "
            "do processes with different limits open it at once?"
        )

    @classmethod
    def _attached(
        cls,
        fd: int,
        target: str,
        info: os.stat_result,
        fields: tuple[Any, ...],
        clock: Clock | None,
        none_key: bool,
    ) -> SharedKeyedTokenBucket:
        """A handle on the table of *fd*, whose header `_read_table` read as *fields*."""
        (_m, _b, _v, _h, num, den, cap, interval, slots, keys, probe, policy, seed0, seed1) = fields
        table = cls.__new__(cls)
        table._file = (info.st_dev, info.st_ino)
        table._attach(
            fd,
            info.st_size,
            HEADER_SIZE,
            target,
            stored_rate(Fraction(num, den)),
            cap,
            interval,
            slots,
            keys,
            probe,
            policy == 1,
            seed0,
            seed1,
            clock,
            none_key,
        )
        return table

    def unlink(self) -> None:
        """Remove the file; processes attached to it keep using the table until they close.

        An anonymous table has no file: nothing to remove. A table that
        replaced this one at the name (`open_or_create` with another limit)
        is not this one's file: it stays.

        >>> path = os.path.join(tmp_dir, "api")
        >>> with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1) as t:
        ...     t.unlink()
        ...     os.path.exists(t.path), t.allow_at("alice", 0)
        (False, True)
        """
        if self.path is not None:
            _unlink_own(self.path, getattr(self, "_file", None))
        elif not self.slot_count:  # made with __new__: no table, anonymous or named
            raise ValueError(
                "this SharedKeyedTokenBucket is not attached to a table: "
                "use SharedKeyedTokenBucket.create or .open"
            )

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        where = "anonymous" if self.path is None else f"path={self.path!r}"
        return (
            f"<SharedKeyedTokenBucket{state} rate={self.rate!r} capacity={self.capacity} "
            f"max_keys={self.max_keys} {where}>"
        )

    def __reduce__(self) -> Any:
        raise TypeError(
            "a SharedKeyedTokenBucket cannot be pickled: open() a named one by name, "
            "or fork the processes that share an anonymous one"
        )


def _reserve(fd: int, size: int) -> None:
    """Make the new file *fd* *size* bytes long, its pages allocated where the OS can."""
    if hasattr(os, "posix_fallocate"):
        # Reserve the pages now: a sparse file on a full tmpfs would
        # kill a worker with SIGBUS on first touch instead.
        os.posix_fallocate(fd, 0, size)
    else:  # pragma: no cover - macOS
        os.ftruncate(fd, size)


def _anonymous_file(size: int) -> int:
    """A new file of *size* bytes, open read-write, that no other process can find or resize."""
    if hasattr(os, "memfd_create"):  # Linux
        import fcntl  # POSIX only: here, so that the package still imports on Windows

        fd = _memfd()
        try:
            _reserve(fd, size)
            # Nobody, the same user included, can now shrink it (SIGBUS in
            # every worker), grow it, or change the seals.
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        except BaseException:
            os.close(fd)
            raise
        return fd
    # Elsewhere a file whose name goes at once (mkstemp: mode 0600, so until
    # then no other user can open it). Once the fd is closed after mapping,
    # no process can reach the file to truncate it.
    fd, tmp = tempfile.mkstemp(prefix=".nanobucket-", dir=default_directory())
    os.unlink(tmp)
    try:
        _reserve(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _memfd() -> int:
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    try:
        # Not executable: Linux 6.3+ logs a warning without this flag, and
        # refuses the call when vm.memfd_noexec is 2.
        return os.memfd_create("nanobucket", flags | getattr(os, "MFD_NOEXEC_SEAL", 8))
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return os.memfd_create("nanobucket", flags)  # a kernel before 6.3


def _open_file(target: str) -> int:
    """Open *target* read-write, never through a symbolic link."""
    flags = os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(target, flags)
    except OSError as e:
        # O_NOFOLLOW on a link: ELOOP (Linux, macOS) or EMLINK (FreeBSD).
        if e.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(target):
            raise BadTableError(
                f"{target}: is a symbolic link; a shared table must be the file itself"
            ) from None
        if isinstance(e, PermissionError):
            with contextlib.suppress(OSError):
                _require_own_file(target, os.lstat(target))  # say why if it is another's file
        raise


def _require_own_file(target: str, info: os.stat_result) -> None:
    uid = os.geteuid()
    if info.st_uid != uid:
        raise BadTableError(
            f"{target}: owned by uid {info.st_uid}, not {uid} (this process's effective "
            "user); another user may have planted it"
        )


def _require_table_file(target: str, info: os.stat_result) -> None:
    """Refuse what is not a regular file of ours that only we can write."""
    if not stat.S_ISREG(info.st_mode):
        raise BadTableError(f"{target}: not a regular file")
    _require_own_file(target, info)
    if info.st_mode & 0o022:
        raise BadTableError(
            f"{target}: writable by group or others (mode {oct(stat.S_IMODE(info.st_mode))}); "
            "a shared table must be writable by its owner only"
        )


def _read_table(target: str, fd: int) -> tuple[os.stat_result, tuple[Any, ...]]:
    """The file *fd* opened at *target*, checked as `open` checks it, and its header's fields."""
    info = os.fstat(fd)
    _require_table_file(target, info)
    return info, _parse_header(target, os.pread(fd, HEADER_SIZE, 0), info.st_size)


def _unlink_own(target: str, own: tuple[int, int] | None) -> None:
    """Remove *target* if it names the file *own* (``(st_dev, st_ino)``); else leave it."""
    import fcntl  # POSIX only: here, so that the package still imports on Windows

    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(target, flags)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):  # a symbolic link: no table's file
            return
        raise
    try:
        # The lock `open_or_create` takes to replace the file: never both at once.
        fcntl.flock(fd, fcntl.LOCK_EX)
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) == own and _still_at(target, info):
            os.unlink(target)
    finally:
        os.close(fd)


def _still_at(target: str, info: os.stat_result) -> bool:
    """Whether *target* still names the file of *info* (no other process replaced it)."""
    try:
        now = os.lstat(target)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)


def _parse_header(target: str, raw: bytes, size: int) -> tuple[Any, ...]:
    """Validate a table header read from *target* (of *size* bytes); its fields."""
    if size < HEADER_SIZE or len(raw) < HEADER_SIZE:
        if raw[:8] == MAGIC[: len(raw[:8])] and raw:
            raise BadTableError(f"{target}: truncated shared table ({size} bytes)")
        raise BadTableError(f"{target}: not a nanobucket shared table")
    fields = _FIELDS.unpack_from(raw)
    (
        magic,
        bom,
        version,
        header_size,
        num,
        den,
        cap,
        interval,
        slots,
        keys,
        probe,
        policy,
        _s0,
        _s1,
    ) = fields
    if magic != MAGIC:
        raise BadTableError(f"{target}: not a nanobucket shared table")
    if bom != BYTE_ORDER_MARK:
        raise BadTableError(f"{target}: a shared table of another byte order")
    if version != LAYOUT_VERSION:
        raise BadTableError(
            f"{target}: shared table layout version {version}; this nanobucket reads "
            f"version {LAYOUT_VERSION}"
        )
    # Unkeyed, so anyone can forge it: it tells a damaged or foreign file from
    # a table, while ownership and mode (_require_table_file) keep forgers out.
    (check,) = _CHECK.unpack_from(raw, _CHECKED)
    if check != hashlib.blake2b(raw[:_CHECKED], digest_size=8).digest():
        raise BadTableError(f"{target}: corrupt shared table header")
    if header_size != HEADER_SIZE or slots < 2 or slots & (slots - 1) or slots > 1 << 42:
        raise BadTableError(f"{target}: corrupt shared table header")
    expected = HEADER_SIZE + slots * SLOT_SIZE
    says = f"header says {slots} slots but the file holds {size} bytes, not {expected}"
    if size < expected:
        raise BadTableError(f"{target}: truncated shared table: {says}")
    if size > expected:
        raise BadTableError(
            f"{target}: shared table has {size - expected} unexpected bytes: {says}"
        )
    try:
        if den <= 0 or num <= 0 or policy not in (0, 1) or not 1 <= probe <= min(slots, PROBE):
            raise ValueError("bad field")
        _exact, _cap, want_interval, _tau = bucket_params(Fraction(num, den), cap)
        validated_max_keys(keys)
        if slots != _slot_count(keys):  # as create sizes it: bounds the slots by max_keys
            raise ValueError("bad field")
    except (TypeError, ValueError):
        raise BadTableError(f"{target}: corrupt shared table header") from None
    if want_interval != interval:
        raise BadTableError(f"{target}: corrupt shared table header")
    return fields
