/** Text shown by the status bar item and the panel (pure functions, tested with jest). */

import { IFleetLoad, IInfo, IJob, INotReadyKind, ISession, IServerEntry } from './api';
import { isFiniteNumber as isNumber, shownText } from './text';

/*
 * Records reach these functions checked (api.ts), but each function still reads its
 * fields as a server may have sent them: a value of the wrong type is shown as unknown or
 * as the JSON that was sent (`shownText`), never thrown on, so one odd field cannot stop
 * the panel's rendering.
 */

/** What the status bar says about one server. */
export interface IStatusSummary {
  online: boolean;
  /** True when nothing was started yet: the focused notebook's kernel has no server and
   * none is configured (its first `%%kcoral` cell starts the embedded one). */
  notYet: boolean;
  server: string;
  /** What a person calls that server (its `label`), for the tooltip. */
  label: string;
  target: string;
  busy: number;
  capacity: number;
  queued: number;
  /** `bubblewrap`, `none`, or '' when the server does not say. */
  sandbox: string;
  /** Why the server is offline, for the tooltip. */
  reason: string;
  /** Set when the server extension could not be asked (no KCoral server's state is known). */
  unreached?: Unreached;
  /** Why an online server cannot be used from here (it refused the token configured for
   * it, or its /v1/info is unusable: the server extension's `error`); '' when it can. */
  problem: string;
}

/** `sm_90a` on a GPU server, else the device, else `cpu`. */
export function targetOf(entry: IServerEntry): string {
  const arch = entry.health?.target?.arch;
  if (arch) {
    return arch;
  }
  const device = entry.info?.device;
  return device && device !== 'cpu' ? device : 'cpu';
}

/**
 * The server the status bar shows: the one the focused notebook's kernel uses, else the
 * one named in the settings, else the first server that no kernel merely announced (a
 * configured one).
 */
export function pickServer(
  servers: IServerEntry[],
  wanted: string,
  kernelId: string | null = null
): IServerEntry | null {
  if (kernelId) {
    const used = servers.find(s => (s.kernels ?? []).includes(kernelId));
    if (used) {
      return used;
    }
  }
  if (wanted) {
    return servers.find(s => s.name === wanted) ?? null;
  }
  return servers.find(s => !s.name.startsWith('kernel-') && !s.name.startsWith('local-')) ?? null;
}

/** What the server extension's routes answered when the panel could not read its servers:
 * its 404 (the extension is not loaded in this Jupyter server: its routes do not exist),
 * another status, or no answer at all (the browser's `TypeError`). */
export type Unreached = 'not-enabled' | 'refused' | 'no-answer';

/** Which `Unreached` an error of the servers route is. */
export function unreachedKind(error: unknown): Unreached {
  const status = (error as { status?: unknown } | null)?.status;
  if (status === 404) {
    return 'not-enabled';
  }
  return typeof status === 'number' ? 'refused' : 'no-answer';
}

/** The panel's sentence for an `Unreached`. */
export function unreachedSentence(unreached: Unreached): string {
  switch (unreached) {
    case 'not-enabled':
      return (
        'The KCoral server extension is not enabled in this Jupyter server: install ' +
        "kcoral[jupyter] where jupyter lab runs and restart it (or run: jupyter server " +
        'extension enable kcoral_jupyter).'
      );
    case 'refused':
      return 'The KCoral server extension cannot be asked (the Jupyter server refused).';
    default:
      return 'The Jupyter server cannot be reached.';
  }
}

export function summarize(
  servers: IServerEntry[] | null,
  wanted: string,
  kernelId: string | null = null,
  unreached: Unreached = 'no-answer'
): IStatusSummary {
  const offline = (server: string, reason: string): IStatusSummary => ({
    online: false,
    notYet: false,
    server,
    label: server,
    target: '',
    busy: 0,
    capacity: 0,
    queued: 0,
    sandbox: '',
    reason,
    problem: ''
  });
  if (servers === null) {
    // Not a KCoral server's state: the panel cannot ask the Jupyter server about any.
    return { ...offline(wanted, unreachedSentence(unreached)), unreached };
  }
  const entry = pickServer(servers, wanted, kernelId);
  if (entry === null) {
    if (!wanted) {
      return { ...offline('', 'no server yet'), notYet: true };
    }
    return offline(wanted, `no configured KCoral server is named ${wanted}`);
  }
  if (!entry.health) {
    return {
      ...offline(entry.name, entry.error || `${entry.url} cannot be reached`),
      label: labelOf(entry)
    };
  }
  const load = entry.health.load;
  return {
    online: true,
    notYet: false,
    server: entry.name,
    label: labelOf(entry),
    target: targetOf(entry),
    busy: load.requests_in_progress,
    capacity: load.request_capacity,
    queued: load.requests_waiting,
    sandbox: entry.info?.sandbox ?? '',
    reason: '',
    problem: entry.error ?? ''
  };
}

/**
 * A server's `problem` (the server extension's `error` for a server that answers /health)
 * in the few words of the status bar: `needs a token`, `token refused`, `refused`, else
 * `not usable (see the panel)`; the tooltip and the panel say it whole.
 */
export function problemWords(problem: string): string {
  if (/needs a token/.test(problem)) {
    return 'needs a token';
  }
  if (/HTTP 401/.test(problem)) {
    return 'token refused';
  }
  if (/HTTP 403/.test(problem)) {
    return 'refused';
  }
  return 'not usable (see the panel)';
}

/** How the panel and the status bar name a server's sandbox mode ('' when unknown). */
export function sandboxText(sandbox: string | undefined): string {
  if (sandbox === 'none') {
    return 'no sandbox';
  }
  return sandbox ? `sandboxed (${sandbox})` : '';
}

/**
 * A server's load in few words: `1/2 busy · 0 queued`. With no worker able to take a
 * program (`request_capacity` 0: the server is shutting down, PROTOCOL §12, or every
 * worker is being replaced) `no worker ready · 1 busy · 0 queued`, not `1/0 busy`.
 */
export function loadText(busy: number, capacity: number, queued: number): string {
  const used = capacity === 0 ? `no worker ready · ${busy} busy` : `${busy}/${capacity} busy`;
  return `${used} · ${queued} queued`;
}

/** What the tooltips add when no worker can take a program (`loadText`). */
export const NO_WORKER_READY =
  'No worker can take a program now: the server is shutting down (its running programs ' +
  'finish), or its workers are restarting.';

/** `KCoral ● sm_90a · 1/2 busy · 0 queued`, `… · no sandbox` when programs run unconfined
 * (never a silent downgrade), `KCoral ● cpu · token refused` when the server answers
 * /health but refuses everything else from here, or `KCoral ● offline`. */
export function statusText(summary: IStatusSummary): string {
  if (summary.notYet) {
    return 'KCoral ○ no server yet (starts with the first cell)';
  }
  if (summary.unreached === 'not-enabled') {
    return 'KCoral ● server extension not enabled';
  }
  if (summary.unreached) {
    return 'KCoral ● no answer from Jupyter';
  }
  if (!summary.online) {
    return 'KCoral ● offline';
  }
  if (summary.problem) {
    // Its load would read as a server ready for cells, which it refuses every one of.
    return `KCoral ● ${summary.target} · ${problemWords(summary.problem)}`;
  }
  const unconfined = summary.sandbox === 'none' ? ' · no sandbox' : '';
  const load = loadText(summary.busy, summary.capacity, summary.queued);
  return `KCoral ● ${summary.target} · ${load}${unconfined}`;
}

export function statusTitle(summary: IStatusSummary): string {
  if (summary.notYet) {
    return (
      "This notebook's kernel uses no KCoral server yet: its first %%kcoral cell starts a " +
      'local one (or uses KCORAL_URL, or %kcoral connect URL). Click to open the KCoral panel.'
    );
  }
  if (summary.unreached) {
    return `${summary.reason} Click to open the KCoral panel.`;
  }
  if (!summary.online) {
    const name = summary.label ? `${summary.label}: ` : '';
    return `KCoral ${name}offline (${summary.reason}). Click to open the KCoral panel.`;
  }
  const sandbox = sandboxText(summary.sandbox);
  const how = sandbox === 'no sandbox' ? 'without a sandbox' : sandbox;
  const mode = sandbox ? ` Programs run ${how}.` : '';
  const ready = summary.capacity === 0 ? ` ${NO_WORKER_READY}` : '';
  if (summary.problem) {
    return `KCoral server ${summary.label}: ${summary.problem}. Click to open the KCoral panel.`;
  }
  return `KCoral server: ${summary.label}.${ready}${mode} Click to open the KCoral panel.`;
}

/** What a person calls a server: its `label` from the server extension, else its name. */
export function labelOf(entry: IServerEntry): string {
  return typeof entry.label === 'string' && entry.label ? entry.label : entry.name;
}

/** The label of the server named `name` among `servers` (the name itself when unknown). */
export function serverLabel(servers: IServerEntry[] | null, name: string | undefined): string {
  if (!name) {
    return '';
  }
  const entry = (servers ?? []).find(s => s.name === name);
  return entry ? labelOf(entry) : name;
}

/** Job states (EXTENSIONS §5) as a person says them. */
const JOB_STATUS_WORDS = new Map<string, string>([
  ['QUEUED', 'queued'],
  ['RUNNING', 'running'],
  ['COMPLETED', 'done'],
  ['FAILED', 'failed'],
  ['CANCELLED', 'cancelled'],
  ['TIMED_OUT', 'timed out'],
  ['ERROR', 'error']
]);

/** A job's status for the table: `done`, `timed out` (a Map: a server's text is no key);
 * `–` when the server sent none. */
export function jobStatusText(status: unknown): string {
  const text = shownText(status);
  if (!text) {
    return '–';
  }
  return JOB_STATUS_WORDS.get(text) ?? text.toLowerCase().replace(/_/g, ' ');
}

/** Whether a job has its worker but waits for its GPUs (`waiting_for: "gpus"`, EXTENSIONS
 * §5): its status stays RUNNING, yet nothing of it runs. */
export function waitsForGpus(job: IJob): boolean {
  return job.status === 'RUNNING' && job.waiting_for === 'gpus';
}

/** What a job is doing, in the output pane's words: its status, or `waiting for GPU`
 * while it waits for its GPUs (it read `running`, as if it ran, for as long as another
 * program held them). */
export function jobStateText(job: IJob): string {
  return waitsForGpus(job) ? 'waiting for GPU' : jobStatusText(job.status);
}

/** The class of a status cell, which the style colours: only for the statuses EXTENSIONS
 * §5 defines, so a server's text never becomes a class name. */
export function jobStatusClass(status: unknown): string {
  return typeof status === 'string' && JOB_STATUS_WORDS.has(status)
    ? `jp-KCoral-status-${status}`
    : '';
}

/** Milliseconds as a whole number, `–` while unknown. */
export function formatMs(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) {
    return '–';
  }
  return String(Math.round(ms));
}

/** An RFC 3339 time as local `HH:MM:SS`, `–` when absent or unreadable. */
export function formatTime(iso: unknown): string {
  if (typeof iso !== 'string' || !iso) {
    return '–';
  }
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) {
    return iso;
  }
  const pad = (n: number): string => String(n).padStart(2, '0');
  return `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

/** The numbers of a list of GPU ids, `–` when there are none (or no list). */
export function formatGpus(ids: unknown): string {
  const numbers = Array.isArray(ids) ? ids.filter(isNumber) : [];
  return numbers.length ? numbers.join(',') : '–';
}

function hasGpus(ids: unknown): boolean {
  return formatGpus(ids) !== '–';
}

/** A duration for a narrow column: `12 ms`, `3.4 s`, `2 min 5 s`; `–` while unknown. */
export function formatDuration(ms: unknown): string {
  if (!isNumber(ms)) {
    return '–';
  }
  if (ms < 1000) {
    return `${Math.round(ms)} ms`;
  }
  if (ms < 60000) {
    return `${(ms / 1000).toFixed(1)} s`;
  }
  const seconds = Math.round(ms / 1000);
  return `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
}

/**
 * The jobs table's columns. Four short ones fit JupyterLab's default side-bar width (eight
 * did not: the table scrolled sideways); the queue, lease-wait and held times are in each
 * row's tooltip.
 */
export const JOB_COLUMNS: { name: string; title: string }[] = [
  { name: 'Status', title: 'Job status' },
  { name: 'Submitted', title: 'Submitted at (local time)' },
  { name: 'Worker', title: 'Worker, and GPU ids on GPU servers' },
  { name: 'Time', title: 'Total time (queue + run); the row tooltip splits it' }
];

/** How long a running job has run, or a queued one has waited, when its server listed it:
 * its server's clock then (`observed_at`) less its `started_at` (`submitted_at`); null for
 * a finished job (its record has the times) or when either is unknown. Counted on the
 * server's clock, not the browser's, which may differ. */
export function soFarMs(job: IJob): number | null {
  const since =
    job.status === 'RUNNING' ? job.started_at : job.status === 'QUEUED' ? job.submitted_at : null;
  const start = typeof since === 'string' ? Date.parse(since) : NaN;
  if (!isNumber(job.observed_at) || Number.isNaN(start)) {
    return null;
  }
  return Math.max(0, job.observed_at * 1000 - start);
}

/** A time so far in whole seconds (`12 s`, `2 min 5 s`): the server's clock (a `Date`
 * header) has no finer grain. */
function formatSoFar(ms: number): string {
  const seconds = Math.floor(ms / 1000);
  return seconds < 60 ? `${seconds} s` : `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
}

/** The Time cell: queue + run of a finished job; of a running one, its queue and its run so
 * far; of a queued one, its wait so far (they said `–` for as long as they ran or waited). */
function jobTimeText(job: IJob): string {
  const queue = isNumber(job.queue_ms) ? job.queue_ms : 0;
  if (isNumber(job.elapsed_ms)) {
    return formatDuration(job.elapsed_ms + queue);
  }
  const soFar = soFarMs(job);
  if (soFar === null) {
    return '–';
  }
  return formatSoFar(job.status === 'RUNNING' ? soFar + queue : soFar);
}

/** One job's cells, in the order of `JOB_COLUMNS`. */
export function jobCells(job: IJob): string[] {
  const worker = shownText(job.worker_id) || '–';
  const gpus = hasGpus(job.gpu_ids) ? ` · GPU ${formatGpus(job.gpu_ids)}` : '';
  return [
    // `waiting for GPU` took the Worker column's header down to `W…`; the tooltip says it.
    waitsForGpus(job) ? 'GPU wait' : jobStatusText(job.status),
    formatTime(job.submitted_at),
    worker + gpus,
    jobTimeText(job)
  ];
}

/** The row tooltip: the job, its server (`serverName`: its label) and its timings in full. */
export function jobTitle(job: IJob, serverName: string = shownText(job.server)): string {
  const where = serverName ? ` on ${shownText(serverName)}` : '';
  const errorKind = shownText(job.error_kind);
  const kind = errorKind ? ` (${errorKind})` : '';
  // A CPU job holds no GPU lease: its lease times would be true zeros of something that
  // never happened, so only a job on GPUs says them.
  const lease = hasGpus(job.gpu_ids)
    ? ` · lease wait ${formatDuration(job.lease_wait_ms)} · held ${formatDuration(job.lease_held_ms)}`
    : '';
  const soFar = soFarMs(job);
  const queue =
    job.status === 'QUEUED' && soFar !== null
      ? `${formatSoFar(soFar)} so far`
      : formatDuration(job.queue_ms);
  const run =
    job.status === 'RUNNING' && soFar !== null
      ? `${formatSoFar(soFar)} so far`
      : formatDuration(job.elapsed_ms);
  const timings = `queue ${queue}${lease} · run ${run}`;
  const waiting = waitsForGpus(job)
    ? '\nwaiting for its GPUs: another program holds them, or its turn has not come'
    : '';
  return `job ${shownText(job.job_id)}${where}${kind}\n${timings}${waiting}`;
}

/** Newest first by submission time; jobs without one go last. */
export function newestFirst(jobs: IJob[]): IJob[] {
  const time = (job: IJob): number => {
    const t = typeof job.submitted_at === 'string' ? Date.parse(job.submitted_at) : NaN;
    return Number.isNaN(t) ? -Infinity : t;
  };
  return jobs
    .map((job, index) => ({ job, index }))
    .sort((a, b) => time(b.job) - time(a.job) || a.index - b.index)
    .map(item => item.job);
}

/** Cancel is offered for jobs that can still be stopped. */
export function isCancellable(status: string | null | undefined): boolean {
  return status === 'QUEUED' || status === 'RUNNING';
}

/** What an instruction of a %%kcoral cell's program does, in the words the cell's own
 * status line uses (runner.describe_instruction: the ids cell_program gives, `cell`,
 * `in:NAME`, ..., and any return); '' for another instruction, which keeps its op and id.
 * The pane said `instruction 2 run cell` where the cell said `running`. */
export function cellStep(op: string, id: string): string {
  if (id === 'in:pickled') {
    return 'sending the pickled inputs';
  }
  if (id.startsWith('in:')) {
    return `sending ${id.slice(3)}`;
  }
  if (id === 'cell_module' || id === 'cell_function') {
    return 'loading the cell';
  }
  if (id === 'cell') {
    return 'running';
  }
  return op.startsWith('return') ? 'returning the results' : '';
}

const PROGRAM_VERBS = new Map([
  ['upload', 'uploading'],
  ['get_function', 'loading'],
  ['run', 'running']
]);

/** What the instruction of a plain program the event names does, as its user thinks of it:
 * `step 3: running run_2`, `step 1: uploading x`. The event has no count of the program's
 * instructions (EXTENSIONS §5: `index` from 0, `op`, `id`), so the line says no `of N`. It
 * said `instruction 2 run run_2`, the program's own jargon. */
function programStep(index: unknown, op: string, id: string): string {
  const step =
    typeof index === 'number' && Number.isInteger(index) && index >= 0 ? `step ${index + 1}: ` : '';
  const what = [PROGRAM_VERBS.get(op) ?? op, id].filter(part => part).join(' ');
  return `${step}${what}` || 'running';
}

/** A short description of a phase event for the output pane. */
export function describePhase(phase: string, fields: Record<string, unknown>): string {
  const field = (name: string): string => shownText(fields[name]);
  switch (phase) {
    case 'queued':
      // `position` counts the requests ahead (EXTENSIONS §5): 0 is next in line.
      return typeof fields.position === 'number' && fields.position > 0
        ? `queued behind ${fields.position}`
        : 'waiting for a worker';
    case 'assigned':
      return field('worker_id') ? `assigned to worker ${field('worker_id')}` : phase;
    case 'instruction':
      return (
        cellStep(field('op'), field('id')) || programStep(fields.index, field('op'), field('id'))
      );
    case 'finished':
      return field('status') ? `finished: ${jobStatusText(field('status'))}` : 'finished';
    case 'lease_wait':
      return 'waiting for the GPU lease';
    case 'lease_held':
      return 'holding the GPU lease';
    default:
      return shownText(phase);
  }
}

/** The line a job's live output ends with where the server cut a stream at the output
 * limit (the `finished` phase's `stdout_truncated` / `stderr_truncated`, EXTENSIONS §5);
 * '' when neither was cut, or the server predates the fields. */
export function truncationNote(fields: Record<string, unknown>): string {
  const cut = ['stdout', 'stderr'].filter(stream => fields[`${stream}_truncated`] === true);
  return cut.length
    ? `[${cut.join(' and ')} truncated at the output limit: the rest was not kept]`
    : '';
}

/** Bytes in binary units for a narrow column: `812 KiB`, `412 MiB`, `1.2 GiB`; `–` when
 * unknown (servers before the field, or a worker that could not be measured). */
export function formatBytes(bytes: number | null | undefined): string {
  if (typeof bytes !== 'number' || !Number.isFinite(bytes) || bytes < 0) {
    return '–';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const shown = unit > 0 && value < 9.95 ? value.toFixed(1) : String(Math.round(value));
  return `${shown} ${units[unit]}`;
}

/** A span of time in its largest whole units, rounded down: `12 s`, `4 min`, `2 h 5 min`. */
export function formatAge(seconds: number): string {
  const whole = Math.max(0, Math.floor(seconds));
  if (whole < 60) {
    return `${whole} s`;
  }
  if (whole < 3600) {
    return `${Math.floor(whole / 60)} min`;
  }
  const minutes = Math.floor((whole % 3600) / 60);
  return `${Math.floor(whole / 3600)} h${minutes ? ` ${minutes} min` : ''}`;
}

/**
 * A time still to come in its largest whole units, rounded up: `8 min` while 7 min 30 s are
 * left, so that a session's idle time (rounded down) plus its time left is never less than
 * its idle limit, and `ends in 1 min` is never said with more than a minute to go.
 */
export function formatTimeLeft(seconds: number): string {
  const whole = Math.max(0, Math.ceil(seconds));
  if (whole < 60) {
    return `${whole} s`;
  }
  const totalMinutes = Math.ceil(whole / 60);
  if (totalMinutes < 60) {
    return `${totalMinutes} min`;
  }
  const minutes = totalMinutes % 60;
  return `${Math.floor(totalMinutes / 60)} h${minutes ? ` ${minutes} min` : ''}`;
}

/** Why a session ended (EXTENSIONS §11 `end_reason`), as a person says it. */
const END_REASON_WORDS = new Map<string, string>([
  ['deleted', 'stopped'],
  ['idle_timeout', 'ended: idle too long'],
  ['worker_exited', 'ended: its worker exited'],
  ['timeout', 'ended: a program ran past its time limit'],
  ['interrupt_grace', 'ended: a program would not stop'],
  ['leftover_work', 'ended: a program left work running'],
  ['shutdown', 'ended: the server shut down']
]);

/** What the panel shows of one session. */
export interface ISessionView {
  shortId: string;
  owner: string;
  gpu: string;
  /** `mem 412 MiB`: the worker's resident memory; `mem –` when the server does not say. */
  memory: string;
  /** `starting`, `running a program`, `idle 2 min · ends in 8 min`, `stopped`,
   * `ended: idle too long`. */
  state: string;
  /** The tooltip: full id, server, worker, programs, and why it ended. */
  title: string;
  live: boolean;
}

/** A text field of a record from a server, which may send anything: '' unless a string. */
function textOf(value: unknown): string {
  return typeof value === 'string' ? value : '';
}

/**
 * One session as the panel shows it. Idle time and time left are counted on the KCoral
 * server's clock (`observed_at`, which the server extension adds) so that a browser whose
 * clock is off still shows true numbers; `browserNow` (Unix seconds) is the fallback.
 */
export function sessionView(
  session: ISession,
  browserNow: number,
  serverName: string = textOf(session.server)
): ISessionView {
  const now = isNumber(session.observed_at) ? session.observed_at : browserNow;
  const gpuIds = Array.isArray(session.gpu_ids) ? session.gpu_ids.filter(isNumber) : [];
  const endReason = textOf(session.end_reason);
  const sessionId = shownText(session.session_id);
  const live = session.state !== 'ENDED';
  let state: string;
  switch (session.state) {
    case 'IDLE': {
      const since = session.last_program_finished_at ?? session.created_at;
      const parts = [isNumber(since) ? `idle ${formatAge(now - since)}` : 'idle'];
      if (isNumber(session.idle_deadline)) {
        const left = session.idle_deadline - now;
        parts.push(left >= 1 ? `ends in ${formatTimeLeft(left)}` : 'ending');
      }
      state = parts.join(' · ');
      break;
    }
    case 'RUNNING':
      state = 'running a program';
      break;
    case 'STARTING':
      state = 'starting';
      break;
    case 'ENDED':
      state =
        END_REASON_WORDS.get(endReason) ??
        (endReason ? `ended: ${endReason.replace(/_/g, ' ')}` : 'ended');
      break;
    default:
      state = shownText(session.state).toLowerCase() || 'state unknown';
  }
  const facts: string[] = [];
  if (textOf(session.worker_id)) {
    facts.push(`worker ${textOf(session.worker_id)}`);
  }
  if (isNumber(session.programs)) {
    facts.push(`${session.programs} program${session.programs === 1 ? '' : 's'}`);
  }
  if (isNumber(session.idle_timeout_seconds)) {
    facts.push(`ends after ${formatAge(session.idle_timeout_seconds)} without a program`);
  }
  const lines = [
    `session ${sessionId}${serverName ? ` on ${shownText(serverName)}` : ''}`,
    facts.join(' · ')
  ];
  if (textOf(session.end_message)) {
    lines.push(textOf(session.end_message));
  }
  return {
    shortId: sessionId.slice(0, 8),
    owner: textOf(session.owner) || '–',
    gpu: gpuIds.length ? `GPU ${gpuIds.join(',')}` : 'CPU',
    memory: `mem ${formatBytes(session.memory_bytes)}`,
    state,
    title: lines.filter(line => line).join('\n'),
    live
  };
}

/** Live sessions first, then newest first (by creation; those without a time go last). */
export function orderSessions(sessions: ISession[]): ISession[] {
  const created = (s: ISession): number => (isNumber(s.created_at) ? s.created_at : -Infinity);
  return sessions
    .map((session, index) => ({ session, index }))
    .sort(
      (a, b) =>
        Number(b.session.state !== 'ENDED') - Number(a.session.state !== 'ENDED') ||
        created(b.session) - created(a.session) ||
        a.index - b.index
    )
    .map(item => item.session);
}

/** The server card's `sessions` line: `1/2 seats held · 10 min idle limit`; '' when the
 * server offers no sessions. */
export function sessionSeatsText(info: IInfo | null | undefined): string {
  const seats = info?.sessions;
  if (!seats || !isNumber(seats.max) || !isNumber(seats.active) || seats.max <= 0) {
    return '';
  }
  const limit = isNumber(seats.idle_timeout_seconds)
    ? ` · ${formatAge(seats.idle_timeout_seconds)} idle limit`
    : '';
  return `${seats.active}/${seats.max} seats held${limit}`;
}

/** The fleet table's columns (a router's `fleet_status`, ROUTER §6) and their tooltips. */
export const FLEET_COLUMNS: { name: string; title: string }[] = [
  {
    name: 'fleet',
    title: 'GPU kind (gpu=…; bold: the default kind, where cells without --select go) or label'
  },
  { name: 'nodes', title: 'ready nodes; of a kind, also those not serving, by state' },
  { name: 'free', title: 'free seats of all seats' },
  { name: 'queue', title: 'requests waiting for these nodes' },
  { name: 'wait', title: 'estimated wait, from recent programs (– without any)' }
];

/** One fleet row as the panel shows it: its cells and its tooltip. */
export interface IFleetRow {
  cells: string[];
  title: string;
  isDefault: boolean;
}

/** An estimated wait in few characters (`–` when not known). */
export function waitText(seconds: unknown): string {
  if (!isNumber(seconds)) {
    return '–';
  }
  if (seconds < 1) {
    return seconds === 0 ? '0 s' : '<1 s';
  }
  if (seconds < 60) {
    return `${Math.round(seconds)} s`;
  }
  return seconds < 3600 ? `${(seconds / 60).toFixed(1)} min` : `${(seconds / 3600).toFixed(1)} h`;
}

function fleetCells(name: string, load: Partial<IFleetLoad>): string[] {
  const count = (value: unknown): string => (isNumber(value) ? String(value) : '–');
  const free =
    isNumber(load.free_seats) && isNumber(load.seats) ? `${load.free_seats}/${load.seats}` : '–';
  return [name, count(load.nodes), free, count(load.queued), waitText(load.estimated_wait_seconds)];
}

/** A kind's cell (`gpu=h100 ×8`) and tooltip (arch too, and whether it is the default). */
function kindName(kind: Partial<INotReadyKind>): { name: string; title: string } {
  const gpu = typeof kind.gpu === 'string' ? kind.gpu : '?';
  const count = isNumber(kind.gpus) && kind.gpus > 0 ? ` ×${kind.gpus}` : '';
  const arch = typeof kind.arch === 'string' && kind.arch ? ` ${kind.arch}` : '';
  const what = kind.default === true ? ': the default kind (requests without --select go here)' : '';
  return { name: `gpu=${gpu}${count}`, title: `gpu=${gpu}${arch}${count}${what}` };
}

/** `1/2 ready · 1 draining` where some nodes of a kind are not serving, else the count. */
export function nodesText(ready: unknown, states: Record<string, number> | undefined): string {
  const out = Object.entries(states && typeof states === 'object' ? states : {}).filter(
    ([, count]) => isNumber(count) && count > 0
  );
  if (!isNumber(ready) || out.length === 0) {
    return isNumber(ready) ? String(ready) : '–';
  }
  const all = ready + out.reduce((sum, [, count]) => sum + count, 0);
  return [`${ready}/${all} ready`, ...out.map(([state, count]) => `${count} ${state}`)].join(' · ');
}

/** The rows of a router's fleet table; none for a direct server (no `fleet_status`). */
export function fleetRows(info: IInfo | null | undefined): IFleetRow[] {
  const fleet = info?.fleet_status;
  if (!fleet || typeof fleet !== 'object') {
    return [];
  }
  const rows: IFleetRow[] = [];
  // The nodes not serving, by kind (ROUTER §6 not_ready): beside the kind's ready count,
  // or a row of their own where none of that kind is ready.
  const notReady = new Map<string, INotReadyKind>();
  for (const kind of Array.isArray(fleet.not_ready) ? fleet.not_ready : []) {
    if (kind && typeof kind === 'object') {
      notReady.set(kindName(kind).title, kind);
    }
  }
  for (const kind of Array.isArray(fleet.kinds) ? fleet.kinds : []) {
    if (!kind || typeof kind !== 'object') {
      continue;
    }
    const { name, title } = kindName(kind);
    const cells = fleetCells(name, kind);
    cells[1] = nodesText(kind.nodes, notReady.get(title)?.states);
    notReady.delete(title);
    rows.push({ cells, title, isDefault: kind.default === true });
  }
  for (const [title, kind] of notReady) {
    const cells = fleetCells(kindName(kind).name, {});
    cells[1] = nodesText(0, kind.states);
    rows.push({ cells, title, isDefault: kind.default === true });
  }
  for (const label of Array.isArray(fleet.labels) ? fleet.labels : []) {
    if (label && typeof label === 'object') {
      const name = `${shownText(label.key) || '?'}=${shownText(label.value) || '?'}`;
      rows.push({ cells: fleetCells(name, label), title: `nodes labelled ${name}`, isDefault: false });
    }
  }
  return rows;
}
