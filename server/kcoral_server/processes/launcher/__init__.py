"""A fork server for workers (SERVER §1): one preloaded process forks each new worker.

Spawning ``python -m kcoral_server.worker`` costs an interpreter start plus the worker's
imports (~1 s on a loaded machine); forking a process that already imported them costs
~25 ms. The launcher imports the worker modules and, when asked (``--preload torch``, the
server's ``--worker-preload``) and installed, torch with numpy, so a worker that touches a
tensor does not pay ``import torch`` (~1.2 s of CPU) either.

The fork rule (SERVER §1): the launcher forks only while it is single-threaded and CUDA is
not initialized, so a fork is as clean as a spawn. Before every fork it checks

* CUDA: ``torch.cuda.is_initialized()`` is False (the only ``torch.cuda`` function the
  launcher calls: it reads a flag and caches no device count). The child sets its own
  environment (``CUDA_VISIBLE_DEVICES`` included) before anything initializes CUDA, which
  a GPU worker does later, under its lease.
* Python threads: none but the main thread (``threading.enumerate()``).
* native threads: none but the main thread (``/proc/self/task``). numpy's bundled OpenBLAS
  starts its pool threads when it loads; OpenBLAS's own ``pthread_atfork`` handler would
  stop them during ``fork()``, but the launcher stops them itself right after the preload
  (``blas_thread_shutdown_``, the function that handler calls), so the rule holds literally
  at every instant the launcher forks. A worker's first BLAS call starts the pool again with
  the usual number of threads: workers' BLAS stays multi-threaded. torch's own pools start
  at its first parallel operation, which the launcher never runs.

A launcher that finds the rule broken refuses to fork: the front-end receives the reason
(``LauncherRefused``), the worker start fails with it in the event log and the request that
waited for the worker, and the remedy is ``--worker-preload none``. It never silently
falls back to a spawn, which would hide a launcher that forks unsafely.

The preload waits until the launcher has had no request for ``PRELOAD_IDLE_SECONDS``, or
``PRELOAD_LATEST_SECONDS`` after it started at the latest: the pool's first workers are
forked (and the server ready) as fast as without it, the import runs while the server
waits for its first request, and a fork request arriving during the import waits for it.
Workers forked before it import torch themselves, as they did without a preload. The
preload's own ``weakref.finalize`` callbacks are not run at a worker's exit, nor walked
when it made none of its own (``finalizers``).

The launcher is one command, ``python -m kcoral_server.processes.launcher``, and its code
is split by the process that runs it:

* ``front_end``: in the front-end, ``Launcher`` (the client of the fork server, which it
  starts) and ``ForkedProcess`` (a forked worker as the front-end sees it);
* ``fork_server``: in the launcher process, the loop that forks, the preload and the fork
  rule;
* ``forked_worker``: in a freshly forked child, from the fork until it runs the worker;
* ``finalizers``: the preload's ``weakref.finalize`` callbacks, marked in the fork server
  and left out of a forked worker's exit;
* ``spawn_supervisor``: in the one-worker supervisor of a spawned worker (``--supervise``);
* ``log_relay``: in the front-end, the thread that copies a launcher's messages (its
  stdout and stderr, a pipe: never the front-end's own stdio) to the server's console;
* ``family`` (a subreaper's bookkeeping of its children, for the fork server and the spawn
  supervisor) and ``wire`` (the messages between the front-end and both) are shared.

Protocol on the launcher's ``AF_UNIX`` ``SOCK_SEQPACKET`` control socket: the front-end
sends ``{"env": {...}, "cgroups": [...], "go": false, "after_preload": false}`` (JSON) with
the worker's socketpair end (``after_preload``: a spare, no program waits for it, so a
launcher whose preload is still to come does it first); the launcher forks, the child moves
itself into the listed ``cgroup.procs`` files before it runs anything else (the per-worker
limits, ``kcoral_server.processes.limits``), and the launcher answers ``{"pid": N,
"preloaded": [...]}`` with the read end of a status pipe, on which it writes the child's
exit code (``subprocess`` convention: ``-signal`` when killed) and the number of orphans
that survived ``SIGKILL`` once it reaped it; or ``{"error": "..."}`` (with ``"refused":
true`` when the fork rule forbade the fork). Workers are children of the launcher, not of
the front-end, hence ``ForkedProcess`` instead of ``subprocess.Popen``.

Under bubblewrap each seat has its own launcher started *inside* that seat's sandbox
(``Launcher(wrap=SandboxDir.command)``), so a sandboxed worker is a fork too. Such a
launcher lives in a PID namespace and cannot see the front-end: it is not given
``--parent`` (bwrap's ``--die-with-parent`` ties it to the front-end instead), its pids are
translated to host pids by the front-end (``NSpid``), and its child waits for the front-end's
"go" (a pipe sent with the request) while the front-end moves it into its cgroups, which
the sandbox cannot reach.

Who can reach what: a *program* in a forked worker reads ``/proc/self/environ``, which is
the launcher's own start-up environment, not the worker's: the launcher is therefore started
with the scrubbed worker environment (no KCoral secret, no denied variable).

Lifetimes (SERVER §11): the launcher is a child subreaper, so whatever a dead worker left
running (``setsid`` daemons included) is re-parented to it; it kills those orphans at once
and reports a worker's exit code only once no orphan is left, so "exited" means "and its
descendants are gone". An orphan that outlives ``SIGKILL`` for ``orphan_kill_seconds()``
(uninterruptible sleep) is reported as a survivor: the front-end then cannot confirm the
clean-up and quarantines the worker's GPUs (SERVER §8, §11). It watches the front-end
through a pidfd and, when the front-end dies, kills every worker and exits; each worker
gets ``SIGKILL`` when the launcher dies (``PR_SET_PDEATHSIG``; the launcher is
single-threaded when it forks, see the fork rule, so that is exact). When the
front-end only closes the control socket the launcher forks nothing more and exits once its
last worker has.
"""
