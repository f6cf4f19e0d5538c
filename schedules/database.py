"""The tuning record database: one JSON line per measured candidate, appended as measured.

Each append writes one whole line with one ``write`` and ``fsync``s it, so a run killed
at any moment leaves at most a truncated last line. Loading skips a line that is not a
valid record (with a warning naming file and line) and keeps the rest; the next append
starts on a fresh line. A rerun reads what is there and measures only what is not
(``measured_keys``).
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata
from pathlib import Path

FORMAT_VERSION = 1


def _package_version() -> str:
    try:
        return metadata.version("tvm-ext")
    except metadata.PackageNotFoundError:
        return "unknown"


VERSION = f"tvm_ext-{_package_version()}/records-{FORMAT_VERSION}"


def candidate_key(candidate: dict) -> str:
    """The canonical text of a candidate, equal for equal candidates (as search_space.candidate_key)."""
    return json.dumps(candidate, sort_keys=True, separators=(",", ":"))


@dataclass
class TuningRecord:
    """One measurement of one candidate of one task on one target (``times_ms`` one per repeat).

    ``cpu`` and ``vector_bits`` say which machine measured it ("" and 0 in records written
    before they existed, or where the CPU is not known): ``matches`` keeps a schedule timed
    for one vector width and cache from being applied on another machine."""

    task: str
    target: str
    candidate: dict
    times_ms: list[float]
    error: str | None = None
    version: str = VERSION
    timestamp: float = field(default_factory=time.time)
    kernel: str = ""  # the kernel's name in the model, for people reading the file
    features: list[float] | None = None  # the cost model's features of the candidate
    cpu: str = ""  # the measuring CPU's model (tvm_ext.host_cpu), "" where unknown
    vector_bits: int = 0  # the target's vector width, 0 where unknown
    kernel_class: str = ""  # the kernel's blocks by kind (``schedules.tasks.kernel_class``): transfer's key

    def matches(self, machine) -> bool:
        """Whether this record may be applied on ``machine`` (a ``tvm_ext.machine.Machine``)
        of the record's own target: same vector width, and same CPU where both are known."""
        return ((not self.vector_bits or self.vector_bits == machine.vector_bits)
                and (not self.cpu or not machine.cpu or self.cpu == machine.cpu))

    @property
    def measured_on(self) -> str:
        return f"{self.cpu or 'an unnamed CPU'}, {self.vector_bits or '?'}-bit vectors, target {self.target}"

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.times_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms) if self.ok else math.inf

    @property
    def key(self) -> str:
        return candidate_key(self.candidate)

    def to_json(self) -> str:
        """One line of JSON; ValueError for a record that could not be read back (a NaN time, ...)."""
        _check_types(self)
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, line: str) -> TuningRecord:
        """Parse one line; ValueError or TypeError names what is wrong."""
        data = json.loads(line)
        if not isinstance(data, dict):
            raise TypeError(f"a record is a JSON object, not {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        missing = {"task", "target", "candidate", "times_ms"} - data.keys()
        if missing:
            raise ValueError(f"missing fields {sorted(missing)}")
        record = cls(**{k: v for k, v in data.items() if k in known})
        _check_types(record)
        if not record.version.endswith(f"/records-{FORMAT_VERSION}"):
            raise ValueError(f"record format {record.version!r}, this version reads records-{FORMAT_VERSION}")
        return record


def _check_types(r: TuningRecord) -> None:
    def number(x) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)

    problems = [name for name, good in [
        ("task", isinstance(r.task, str)), ("target", isinstance(r.target, str)),
        ("candidate", isinstance(r.candidate, dict)),
        ("times_ms", isinstance(r.times_ms, list) and all(number(t) for t in r.times_ms)),
        ("error", r.error is None or isinstance(r.error, str)), ("version", isinstance(r.version, str)),
        ("timestamp", number(r.timestamp)), ("kernel", isinstance(r.kernel, str)),
        ("features", r.features is None or (isinstance(r.features, list) and all(number(x) for x in r.features))),
        ("cpu", isinstance(r.cpu, str)), ("kernel_class", isinstance(r.kernel_class, str)),
        ("vector_bits", isinstance(r.vector_bits, int) and not isinstance(r.vector_bits, bool)),
    ] if not good]
    if problems:
        raise ValueError(f"task {r.task!r}: fields {problems} have the wrong type or a non-finite number")


class TuningDatabase:
    """Records in a JSON Lines file at ``path``, loaded on construction, appended one by one."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._records: list[TuningRecord] = []
        self._by_task: dict[tuple[str, str], list[TuningRecord]] = {}
        self._by_kernel: dict[str, list[TuningRecord]] = {}
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        for lineno, raw in enumerate(self.path.read_bytes().split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                record = TuningRecord.from_json(raw.decode("utf-8"))
            except (ValueError, TypeError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                warnings.warn(f"{self.path}:{lineno}: skipped a corrupt tuning record ({err})", stacklevel=3)
                continue
            self._add(record)

    def _add(self, record: TuningRecord) -> None:
        self._records.append(record)
        self._by_task.setdefault((record.task, record.target), []).append(record)
        self._by_kernel.setdefault(record.task, []).append(record)

    def append(self, record: TuningRecord) -> None:
        """Write ``record`` as one line and fsync it; after a killed writer's partial line,
        start on a new line so that both stay separate."""
        line = (record.to_json() + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            written = os.write(fd, line)
            while written < len(line):  # a short write (disk full, signal): finish the line
                written += os.write(fd, line[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        self._add(record)

    def records(self, task: str | None = None, target: str | None = None) -> list[TuningRecord]:
        """Records in file order, of one task and/or target if given."""
        if task is not None and target is not None:
            return list(self._by_task.get((task, target), []))
        if task is not None:
            return list(self._by_kernel.get(task, []))
        return [r for r in self._records
                if (task is None or r.task == task) and (target is None or r.target == target)]

    def best(self, task: str, target: str) -> TuningRecord | None:
        """The successful record with the lowest median time, or None."""
        ok = [r for r in self._by_task.get((task, target), []) if r.ok]
        return min(ok, key=lambda r: r.median_ms, default=None)

    def measured_keys(self, task: str, target: str) -> set[str]:
        """Canonical keys (``candidate_key``) of the candidates measured for this task, failed ones too."""
        return {r.key for r in self._by_task.get((task, target), [])}

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self):
        return iter(self._records)


__all__ = ["FORMAT_VERSION", "VERSION", "TuningDatabase", "TuningRecord", "candidate_key"]
