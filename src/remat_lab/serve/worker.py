"""The process boundary: JAX work runs in recyclable worker processes that the app talks to by queues.

A ``Pool`` (no Streamlit) owns ``size`` worker processes (``spawn``: JAX is not fork-safe), each
fed by one dispatcher thread from a shared job queue. A job is a kind (``run``, ``programs``,
``compare``, ``advise``, ``advise_sizes``, ``environment``, ``device_limit``) and a picklable
payload; its stages come back as they happen. Equal jobs in flight are one job (concurrent
sessions share one computation).

* The queue is served round-robin by visitor (``fairqueue``: the lane served least recently goes
  next; ``visitors``: a lane is the client's address, or a trusted proxy's forwarded one, else the
  session), so one visitor's burst, from however many tabs, cannot hold back another's run. A
  session has at most one queued job: its newer request replaces the queued one (``Superseded``),
  a running one is kept; a visitor has at most ``quotas.visitor_cap()`` jobs queued or running
  (2 on a public server), and a request past it is refused with a sentence (``Busy``).
* Every job kind has a wall-clock deadline (``quotas.DEADLINES_S``, scaled by
  ``$REMAT_LAB_JOB_DEADLINE_S``): past it the worker is killed and a new one started, and the
  caller gets ``TimeLimit`` ("Stopped after 180 s, this server's limit for an advice; …").

* A worker that dies (the kernel's out-of-memory killer, an XLA abort) fails only its job, with
  ``WorkerLost`` ("this configuration ran out of memory in the worker (limit X)"); a new worker
  is started for the next job.
* A job nobody waits for any more (every session that asked for it is gone, as the page's waits
  or the runtime say: ``Pool.session_alive``) is stopped: its
  worker is killed and replaced. A job that finishes is returned to whoever still waits, and the
  caller caches it even when its own session left.
* A worker is recycled after ``max_runs`` jobs or when its RSS passes ``max_rss``, so growth
  (XLA's caches, compiled executables) cannot accumulate.
* Before a job, the worker's and the server's RSS plus the job's estimate must fit in the memory
  limit (the cgroup's) less ``margin``; a worker grown above its start is recycled first.
* One timing at a time: timed kinds hold one server-side lock while they run, whatever the pool
  size (a killed worker cannot leave it held).

``size=0`` runs jobs in the calling thread (tests that patch the engine; the CLI never uses a
pool). Workers turn on the persistent compilation cache and warm up with a tiny untimed run.

Its parts: ``in_worker`` (what a worker process runs: ``execute``, the ``serve`` loop, ``WARM``),
``jobs`` (``Job``, shared by equal callers; ``WorkerLost``, ``TimeLimit``, ``Abandoned``,
``Superseded``, ``Busy``), ``fairqueue`` (``FairQueue``), ``visitors`` (``Lane``: who asks),
``quotas`` (deadlines, public bounds) and ``pool``
(``Pool``: its processes, dispatch, recycling and memory check; ``shared_pool``). This module
names them all.
"""

from remat_lab.serve.fairqueue import FairQueue
from remat_lab.serve.in_worker import WARM, error_reply, execute, serve
from remat_lab.serve.jobs import Abandoned, Busy, Job, Superseded, TimeLimit, WorkerLost
from remat_lab.serve.pool import MARGIN, TIMED, Pool, shared_pool

__all__ = ["MARGIN", "TIMED", "WARM", "Abandoned", "Busy", "FairQueue", "Job", "Pool", "Superseded",
           "TimeLimit", "WorkerLost", "error_reply", "execute", "serve", "shared_pool"]
