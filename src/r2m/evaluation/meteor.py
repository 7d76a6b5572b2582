"""METEOR 1.5 as coco-caption runs it, with the segments spread over several Java threads or processes.

pycocoevalcap's wrapper starts one ``meteor-1.5.jar - - -stdio -l en -norm`` process, sends one
``SCORE ||| ref1 ||| … ||| hyp`` line per image and waits for its answer (the segment's sufficient
statistics) before sending the next, then sends a single ``EVAL ||| stats1 ||| … ||| statsN`` line
and reads N per-segment scores followed by the corpus score. METEOR's corpus score is computed by
the jar from the *summed* statistics of all segments (not a mean of segment scores), so splitting
the EVAL line would change it. Here:

* the SCORE lines are split into contiguous shards, one per Java process; each shard is written
  in one go by a writer thread while the answers are read back (pipelined: no round trip per
  line, no pipe deadlock) — a segment's statistics depend on that segment alone;
* or, with a JDK, one JVM runs our helper ``java/R2mMeteorThreads.java`` on the same jar: the
  paraphrase table is loaded once and the segments are scored on several threads, each with a
  scorer sharing the loaded resources (the jar's ``MeteorScorer(MeteorScorer)``);
* the statistics, put back in the original order, go to one process in the same single EVAL line
  pycocoevalcap sends, so per-segment scores and the corpus score are the jar's own, byte for
  byte the ones the sequential wrapper gets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

HELPER = Path(__file__).resolve().parent / "java" / "R2mMeteorThreads.java"


# for a short run: one GC thread, the quick JIT only (half the CPU of a METEOR start that loads a
# cut table, and of the PTB tokeniser's run; Java's floating point is strict, the same numbers
# under any JIT)
QUICK_JVM = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


# above this many segments the optimising JIT repays its compile time (measured on 2 cores: 5,000
# segments 2.9 CPU-s quick vs 3.8; 25,000 segments 13.3 vs 11.2); the serial collector either way
QUICK_MAX_SEGMENTS = 10_000
SERIAL_GC = ("-XX:+UseSerialGC",)


def compiled_helper() -> Path | None:
    """A folder holding ``R2mMeteorThreads.class`` compiled from :data:`HELPER` (once per source file
    version, by size and modification time, and JDK, under the r2m cache), or ``None`` when it cannot be had (then the launcher compiles the
    source on every start, ~0.4 CPU-seconds)."""
    import fcntl
    import hashlib

    from r2m.vision.downloads import cache_root

    javac = shutil.which("javac")
    if javac is None:
        return None
    st = HELPER.stat()  # not read here: a run's record lists the source as handed to the JVM (kind exec)
    key = hashlib.sha256(f"{HELPER}|{st.st_size}|{st.st_mtime_ns}|{os.path.realpath(javac)}".encode()).hexdigest()[:16]
    folder = cache_root() / "meteor-helper" / key
    if (folder / "R2mMeteorThreads.class").is_file():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one compile; the others wait for it
            if not (folder / "R2mMeteorThreads.class").is_file():
                from pycocoevalcap.meteor import meteor as m

                tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=folder.parent))
                try:
                    jar = Path(m.__file__).resolve().parent / m.METEOR_JAR
                    subprocess.run([javac, "-cp", str(jar), "-d", str(tmp), str(HELPER)], check=True,
                                   capture_output=True)
                    os.replace(tmp, folder)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return folder


def _jar_dir_and_cmd(threads: int = 1, paraphrases: Path | None = None,
                     quick: bool = False) -> tuple[Path, list[str]]:
    from pycocoevalcap.meteor import meteor as m

    jar_dir = Path(m.__file__).resolve().parent
    table = [] if paraphrases is None else [str(paraphrases)]
    java = ["java", *(QUICK_JVM if quick else SERIAL_GC)]
    if threads > 1:  # our helper on the same jar: compiled once, else run from source by the JDK's launcher
        classes = compiled_helper()
        if classes is None:
            return jar_dir, [*java, "-Xmx2G", "-cp", m.METEOR_JAR, str(HELPER), str(threads), *table]
        # the source stays on the class path (Java skips an entry that is no folder or jar) so that a
        # run's record (r2m.utils.reads) lists it among the files handed to the JVM
        cp = os.pathsep.join([m.METEOR_JAR, str(classes), str(HELPER)])
        return jar_dir, [*java, "-Xmx2G", "-cp", cp, "R2mMeteorThreads", str(threads), *table]
    return jar_dir, [*java, "-jar", "-Xmx2G", m.METEOR_JAR, "-", "-", "-stdio", "-l", "en", "-norm",
                     *(["-a", *table] if table else [])]


def threads_available() -> bool:
    """The threaded helper needs a JDK (``java`` runs a ``.java`` file only with the compiler)."""
    return shutil.which("javac") is not None


def score_line(hypothesis: str, references: Sequence[str]) -> str:
    """The SCORE line pycocoevalcap's ``Meteor._stat`` writes for one segment."""
    hypothesis = hypothesis.replace("|||", "").replace("  ", " ")
    return " ||| ".join(("SCORE", " ||| ".join(references), hypothesis))


class MeteorPool:
    """``procs`` METEOR Java processes, each scoring on ``threads`` threads; started at construction
    (the JVMs load while we tokenise). ``paraphrases``: a paraphrase table to load instead of the
    jar's 5.3-million-entry default (:class:`SegmentMeteor` passes one cut to its segments);
    ``quick``: the JVM flags :data:`QUICK_JVM` for a short run.

    ``threads > 1`` runs our helper ``java/R2mMeteorThreads.java`` on the same jar: one JVM loads
    the paraphrase table once and scores the segments on several threads (scorers sharing the
    loaded resources through the jar's ``MeteorScorer(MeteorScorer)`` constructor), answering
    SCORE and EVAL exactly as the jar's ``-stdio`` mode does. ``threads == 1``: the jar itself.
    """

    def __init__(self, procs: int = 1, threads: int = 1, paraphrases: Path | None = None,
                 quick: bool = False) -> None:
        if procs < 1 or threads < 1:
            raise ValueError(f"METEOR needs at least one process and thread, got {procs}, {threads}")
        self.threads = threads
        cwd, cmd = _jar_dir_and_cmd(threads, paraphrases, quick)
        self._logs: list[IO[bytes]] = []
        self.procs: list[subprocess.Popen] = []
        for _ in range(procs):
            log = tempfile.TemporaryFile(prefix="r2m-meteor-")
            self._logs.append(log)
            self.procs.append(subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=log))

    def _exchange(self, k: int, lines: Sequence[str], answers: int | None = None) -> list[str]:
        """Send ``lines`` to process ``k`` and read ``answers`` lines back (default: one per line)."""
        proc = self.procs[k]
        head = f"SCORES {len(lines)}\n" if self.threads > 1 and answers is None else ""
        payload = (head + "".join(f"{ln}\n" for ln in lines)).encode()
        failed: list[BaseException] = []

        def write() -> None:
            try:
                proc.stdin.write(payload)
                proc.stdin.flush()
            except OSError as exc:  # the process died; the reader reports it
                failed.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        out = []
        for _ in range(len(lines) if answers is None else answers):
            got = proc.stdout.readline()
            if not got:
                writer.join(timeout=1)
                raise RuntimeError(f"METEOR process exited (code {proc.poll()}): {self._stderr(k)}")
            out.append(got.decode().strip())
        writer.join()
        return out

    def _stderr(self, k: int) -> str:
        log = self._logs[k]
        log.seek(0)
        return log.read().decode(errors="replace")[-2000:].strip() or "(no message)"

    def compute(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> tuple[float, list[float]]:
        """Corpus METEOR and per-segment scores, as ``pycocoevalcap.meteor.Meteor.compute_score``."""
        score, scores, _ = self.compute_stats(hypotheses, references)
        return score, scores

    def compute_stats(self, hypotheses: Sequence[str],
                      references: Sequence[Sequence[str]]) -> tuple[float, list[float], list[str]]:
        """:meth:`compute` plus each segment's sufficient statistics as the jar wrote them (23
        numbers: lengths, function words, 4 modules × content/function matches, chunks, word
        matches), from which :func:`r2m.evaluation.bootstrap.meteor_aggregate` recomputes the
        corpus score of any multiset of segments."""
        if len(hypotheses) != len(references):
            raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} reference sets")
        lines = [score_line(h, r) for h, r in zip(hypotheses, references, strict=True)]
        n = len(self.procs)
        bounds = [len(lines) * k // n for k in range(n + 1)]
        shards: list[list[str] | None] = [None] * n
        errors: list[BaseException] = []

        def run(k: int) -> None:
            try:
                shards[k] = self._exchange(k, lines[bounds[k]:bounds[k + 1]])
            except BaseException as exc:  # noqa: BLE001 - re-raised below in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(1, n)]
        for t in threads:
            t.start()
        run(0)
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        stats = [s for shard in shards for s in shard or []]
        if not stats:
            raise ValueError("METEOR needs at least one segment")
        # one EVAL line, answered by one line per segment and then the corpus score
        answer = self._exchange(0, ["EVAL" + "".join(f" ||| {s}" for s in stats)], answers=len(stats) + 1)
        return float(answer[-1]), [float(x) for x in answer[:-1]], stats

    def close(self) -> None:
        for proc, log in zip(self.procs, self._logs, strict=True):
            if proc.poll() is None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
                proc.kill()
            proc.wait()
            log.close()
        self.procs = []
        self._logs = []

    def __enter__(self) -> MeteorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SMALL = 500  # segments: below this one jar process on one thread (a JVM start costs more than it saves)


class SegmentMeteor:
    """A METEOR handle that starts its JVM(s) only when it sees the segments, each loading the
    paraphrase table cut to the entries these segments can use (:mod:`r2m.evaluation.paraphrase`:
    the same statistics and scores, ~0.6 instead of ~7 CPU-seconds a start), or the full table
    when no cut is safe. ``procs``/``threads`` as :class:`MeteorPool`; under :data:`SMALL`
    segments one jar process on one thread. A cut table runs under the quick JVM flags up to
    :data:`QUICK_MAX_SEGMENTS` segments (the jar's work is then mostly start-up and warm-up)."""

    def __init__(self, procs: int = 1, threads: int = 1) -> None:
        self.procs, self.threads = procs, threads

    def compute_stats(self, hypotheses: Sequence[str],
                      references: Sequence[Sequence[str]]) -> tuple[float, list[float], list[str]]:
        from r2m.evaluation.paraphrase import filtered_table

        small = len(hypotheses) < SMALL
        procs, threads = (1, 1) if small else (self.procs, self.threads)
        with tempfile.TemporaryDirectory(prefix="r2m-meteor-") as tmp:
            table = filtered_table(hypotheses, references, Path(tmp) / "paraphrase.gz")
            quick = table is not None and len(hypotheses) <= QUICK_MAX_SEGMENTS
            with MeteorPool(procs, threads, table, quick=quick) as pool:
                return pool.compute_stats(hypotheses, references)

    def close(self) -> None:
        """Nothing to stop: each :meth:`compute_stats` stops its own JVMs."""
