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

File layout (native byte order; the file is only shared on one machine):
a 128-byte header, then ``slot_count`` 16-byte slots of two int64 words
(key fingerprint, GCRA tat; see ``_shared_c`` for their states). The header
holds, as 8-byte fields: magic, byte-order mark, layout version, header
size, the rate as an exact fraction (numerator, denominator), capacity,
interval_ns, slot count, max_keys, probe length, the full-window policy, the
128-bit hash seed, a BLAKE2b check of the fields before it, and last the
table's one shared variable, the reclaim horizon (0 in a new file).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import struct
import tempfile
from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ._params import RateLike, bucket_params, check_max_keys

__all__ = ("BadTableError", "SharedKeyedTokenBucket", "default_directory")

MAGIC = b"NBSHMKT\x00"
BYTE_ORDER_MARK = 0x0102030405060708
LAYOUT_VERSION = 2  # 2: 63-bit fingerprints, claims, the horizon word
HEADER_SIZE = 128
SLOT_SIZE = 16
# Slots a key may live in: bounds every lookup. At most half full, a new key
# finds all 64 live only with odds of about 1e-10 (measured: at exactly half
# full, 3e-5 of keys sit over 24 slots from home, 2e-6 over 32, falling about
# tenfold per 8 slots); lookups stop at the first empty slot, so a long window
# costs nothing until a cluster needs it.
PROBE = 64
DEFAULT_MAX_KEYS = 100_000  # a 4 MiB file
WHEN_FULL = ("reject", "admit")
INT64_MAX = (1 << 63) - 1

# magic, bom, version, header size, rate num, rate den, capacity, interval_ns,
# slot count, max_keys, probe, when_full, seed0, seed1; then check, horizon.
_FIELDS = struct.Struct("=8sQQQqqqqqqqqQQ")
_CHECKED = _FIELDS.size  # 112 bytes covered by the check
_CHECK = struct.Struct("=8s8x")  # at 112: the check, then the horizon (shared state, unchecked)

Clock = Callable[[], int]

if TYPE_CHECKING:  # _shared_c.pyi types the extension
    from ._shared_c import SharedTable as _Base
else:
    try:
        from ._shared_c import SharedTable as _Base
    except ImportError:  # pragma: no cover - a pure-Python install
        _Base = None


class BadTableError(ValueError):
    """The file is not a usable shared table: foreign, truncated, corrupt or another version.

    A ``ValueError``, raised by `SharedKeyedTokenBucket.open`.

    >>> import pathlib, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     notes = pathlib.Path(d, "notes.txt")
    ...     n = notes.write_text("not a table" * 20)
    ...     SharedKeyedTokenBucket.open(path=notes)
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


class SharedKeyedTokenBucket(_Table):
    """A ``KeyedTokenBucket`` in shared memory: one limit for all processes mapping it.

    Make one with ``create`` (before the workers fork, or in one of them) and
    attach with ``open`` (or just inherit it across ``fork``). Keys are
    ``str`` (hashed as UTF-8), ``bytes``, or ``int`` (hashed as 8-byte
    little-endian two's complement when in int64 range, else as its minimal
    two's complement bytes); ``"1"``, ``b"1"`` and ``1`` are different keys.
    Other types raise ``TypeError``.

    The table holds ``max_keys`` keys at most half-full; a key lives in one of
    64 slots, and a new key takes an empty slot or reclaims one whose bucket
    is full (lossless: a full bucket and a missing key are the same state).
    ``max_keys`` live keys all fit but with odds of about 1e-10 per key (a
    million live keys: no refusal in any run). When all 64 hold live
    buckets, ``when_full="reject"`` (the default: fail closed) refuses the
    new key until one fills up, with ``retry_after`` set to that moment;
    ``"admit"`` (fail open) admits it without tracking it.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = os.path.join(d, "demo")   # or create("demo", ...): /dev/shm/demo
    ...     with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=2) as t:
    ...         [t.allow_at("alice", 0) for _ in range(3)]
    [True, True, False]
    """

    keyed = True  # the verbs take the key first

    __slots__ = ()

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(
            "use SharedKeyedTokenBucket.create(...) or SharedKeyedTokenBucket.open(...)"
        )

    @classmethod
    def create(
        cls,
        name: str | None = None,
        *,
        rate: RateLike,
        capacity: int,
        max_keys: int = DEFAULT_MAX_KEYS,
        path: str | os.PathLike[str] | None = None,
        mode: int = 0o600,
        when_full: str = "reject",
        clock: Clock | None = None,
    ) -> SharedKeyedTokenBucket:
        """Create a new table file (``FileExistsError`` if it exists) and attach to it.

        *name* is a file under ``/dev/shm``; or give ``path=``. The file
        appears complete or not at all (it is built aside, then linked in).

        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     path = os.path.join(d, "api")   # or create("api", ...): /dev/shm/api
        ...     with SharedKeyedTokenBucket.create(path=path, rate=100, capacity=200) as t:
        ...         t.rate, t.capacity, t.max_keys, t.when_full
        (100, 200, 100000, 'reject')
        """
        _require_extension()
        target = _resolve(name, path)
        exact, cap, interval, _tau = bucket_params(rate, capacity)
        keys = check_max_keys(max_keys)
        if when_full not in WHEN_FULL:
            raise ValueError(f"when_full must be 'reject' or 'admit', got {when_full!r}")
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
            raise ValueError(f"mode must be a permission int such as 0o600, got {mode!r}")
        if exact.numerator > INT64_MAX or exact.denominator > INT64_MAX:
            raise ValueError(f"rate {rate!r} is too fine a fraction to store (num/den > 2**63)")
        if clock is not None and not callable(clock):
            raise TypeError(
                f"clock must be a callable returning int ns, not {type(clock).__name__}"
            )
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
        fd, tmp = tempfile.mkstemp(prefix=".nanobucket-", dir=os.path.dirname(target) or ".")
        try:
            os.fchmod(fd, mode)
            if hasattr(os, "posix_fallocate"):
                # Reserve the pages now: a sparse file on a full tmpfs would
                # kill a worker with SIGBUS on first touch instead.
                os.posix_fallocate(fd, 0, size)
            else:  # pragma: no cover - macOS
                os.ftruncate(fd, size)
            os.pwrite(fd, header, 0)
            table = cls.__new__(cls)
            table._attach(
                fd,
                size,
                HEADER_SIZE,
                target,
                _public_rate(rate, exact),
                cap,
                interval,
                slots,
                keys,
                probe,
                when_full == "admit",
                seed0,
                seed1,
                clock,
            )
            os.link(tmp, target)  # atomic and exclusive: FileExistsError if taken
        finally:
            os.close(fd)
            os.unlink(tmp)
        return table

    @classmethod
    def open(
        cls,
        name: str | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        clock: Clock | None = None,
    ) -> SharedKeyedTokenBucket:
        """Attach to an existing table; rate, capacity and the rest come from its header.

        Raises ``BadTableError`` (a ``ValueError``) for a file that is not
        such a table, is truncated or corrupt, or has another layout version.

        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     path = os.path.join(d, "api")
        ...     with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=2) as a:
        ...         with SharedKeyedTokenBucket.open(path=path) as b:   # as another worker would
        ...             a.allow_at("alice", 0), b.allow_at("alice", 0), b.allow_at("alice", 0)
        (True, True, False)
        """
        _require_extension()
        target = _resolve(name, path)
        fd = os.open(target, os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise BadTableError(f"{target}: not a regular file")
            raw = os.pread(fd, HEADER_SIZE, 0)
            fields = _parse_header(target, raw, info.st_size)
            (_m, _b, _v, _h, num, den, cap, interval, slots, keys, probe, policy, seed0, seed1) = (
                fields
            )
            if clock is not None and not callable(clock):
                raise TypeError(
                    f"clock must be a callable returning int ns, not {type(clock).__name__}"
                )
            rate = Fraction(num, den)
            table = cls.__new__(cls)
            table._attach(
                fd,
                info.st_size,
                HEADER_SIZE,
                target,
                rate.numerator if rate.denominator == 1 else rate,
                cap,
                interval,
                slots,
                keys,
                probe,
                policy == 1,
                seed0,
                seed1,
                clock,
            )
        finally:
            os.close(fd)
        return table

    def unlink(self) -> None:
        """Remove the file; processes attached to it keep using the table until they close.

        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     path = os.path.join(d, "api")
        ...     with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=1) as t:
        ...         t.unlink()
        ...         os.path.exists(t.path), t.allow_at("alice", 0)
        (False, True)
        """
        os.unlink(self.path)

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return (
            f"<SharedKeyedTokenBucket{state} rate={self.rate!r} capacity={self.capacity} "
            f"max_keys={self.max_keys} path={self.path!r}>"
        )

    def __reduce__(self) -> Any:
        raise TypeError("a SharedKeyedTokenBucket cannot be pickled: open() it by name instead")


def _public_rate(rate: object, exact: Fraction) -> int | Fraction:
    # As KeyedTokenBucket reports it: ints and Fractions as given, the rest exact.
    return rate if isinstance(rate, (int, Fraction)) else exact


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
    (check,) = _CHECK.unpack_from(raw, _CHECKED)
    if check != hashlib.blake2b(raw[:_CHECKED], digest_size=8).digest():
        raise BadTableError(f"{target}: corrupt shared table header")
    if header_size != HEADER_SIZE or slots < 2 or slots & (slots - 1) or slots > 1 << 42:
        raise BadTableError(f"{target}: corrupt shared table header")
    expected = HEADER_SIZE + slots * SLOT_SIZE
    if size < expected:
        raise BadTableError(f"{target}: truncated shared table ({size} of {expected} bytes)")
    if size > expected:
        raise BadTableError(f"{target}: shared table has {size - expected} unexpected bytes")
    try:
        if den <= 0 or num <= 0 or policy not in (0, 1) or not 1 <= probe <= slots:
            raise ValueError("bad field")
        _exact, _cap, want_interval, _tau = bucket_params(Fraction(num, den), cap)
        check_max_keys(keys)
    except (TypeError, ValueError):
        raise BadTableError(f"{target}: corrupt shared table header") from None
    if want_interval != interval:
        raise BadTableError(f"{target}: corrupt shared table header")
    return fields
