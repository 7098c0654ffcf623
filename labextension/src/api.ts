/**
 * The REST API of the KCoral Jupyter server extension (`{base_url}kcoral/api/`): typed
 * records and a thin client over an injected fetch function, so tests need no JupyterLab.
 */

import { isFiniteNumber, shownText } from './text';

/** `/health` of a KCoral server (PROTOCOL §12). */
export interface IHealth {
  status: string;
  instance_id: string;
  started_at: string;
  gpu_count: number | null;
  load: {
    request_capacity: number;
    requests_in_progress: number;
    requests_waiting: number;
  };
  target: Record<string, string>;
  versions: Record<string, string>;
}

/** `/v1/info` of a KCoral server (EXTENSIONS §1). */
export interface IInfo {
  kcoral: string;
  /** Null when the server did not say (or not as a number). */
  protocol: number | null;
  features: string[];
  device: string;
  /** The mode programs run in (EXTENSIONS §1); absent on servers before 2026-12. */
  sandbox?: string;
  limits?: Record<string, number>;
  /** Session seats (EXTENSIONS §11); absent on servers without the `sessions` feature. */
  sessions?: { max: number; active: number; idle_timeout_seconds: number | null };
  /** A router's fleet now (ROUTER §6): absent from a direct server. */
  fleet_status?: IFleetStatus;
}

/** What one part of a router's fleet holds now (ROUTER §6 `fleet_status`); null where
 * the router did not say (or not as a number). */
export interface IFleetLoad {
  nodes: number | null;
  seats: number | null;
  free_seats: number | null;
  queued: number | null;
  recent_programs: number | null;
  /** An estimate; null without recent programs. */
  estimated_wait_seconds: number | null;
}

/** A router's `/v1/info` `fleet_status`: per GPU kind (the default first), per label. */
export interface IFleetStatus {
  kinds: (IFleetLoad & {
    gpu: string | null;
    arch: string | null;
    gpus: number | null;
    default: boolean;
  })[];
  labels: (IFleetLoad & { key: string; value: string })[];
  /** Per kind, the nodes the router keeps that are not serving, counted by state (a
   * state no router names as `other`); absent from routers before it. */
  not_ready?: INotReadyKind[];
}

/** The node states a router names besides `ready` (ROUTER §6). */
export const NODE_STATES = [
  'starting',
  'recovering',
  'incompatible',
  'unhealthy',
  'draining',
  'left'
];

/** One kind's nodes that are not serving (ROUTER §6 `fleet_status.not_ready`). */
export interface INotReadyKind {
  gpu: string | null;
  arch: string | null;
  gpus: number | null;
  default: boolean;
  /** Node count by state, each above 0. */
  states: Record<string, number>;
}

/** One configured server as `GET kcoral/api/servers` describes it. */
export interface IServerEntry {
  /** The routing name (`?server=`): configured, `default`, `local-<pid>`, `kernel-<id>`. */
  name: string;
  /** What a person calls it: the configured name, `local server of NOTEBOOK`, or its URL. */
  label?: string;
  /** The notebooks whose kernels use it. */
  notebooks?: string[];
  url: string;
  auth: boolean;
  health: IHealth | null;
  info: IInfo | null;
  features: string[];
  reachable: boolean;
  error?: string;
  /** Ids of the live kernels whose cells use this server (their embedded or connected one). */
  kernels?: string[];
}

/** Job states (EXTENSIONS §5). */
export type JobStatus =
  | 'QUEUED'
  | 'RUNNING'
  | 'COMPLETED'
  | 'FAILED'
  | 'CANCELLED'
  | 'TIMED_OUT'
  | 'ERROR';

/** One job (EXTENSIONS §5 fields, plus the `server` the extension found it on). */
export interface IJob {
  job_id: string;
  request_id: string;
  /** '' when the server sent no status (or not as a string). */
  status: JobStatus | string;
  submitted_at: string | null;
  started_at: string | null;
  finished_at: string | null;
  worker_id: string | number | null;
  gpu_ids: number[] | null;
  target: Record<string, string> | null;
  queue_position: number | null;
  queue_ms: number | null;
  lease_wait_ms: number | null;
  lease_held_ms: number | null;
  elapsed_ms: number | null;
  error_kind: string | null;
  /** `'gpus'` while a RUNNING job waits for its GPU lease or set (EXTENSIONS §5). */
  waiting_for: string | null;
  /** Its server's clock when it listed the job (Unix seconds), which the server extension
   * adds; null when that server sent no `Date`. */
  observed_at?: number | null;
  server?: string;
}

/** What went wrong with one server's part of a list answer. */
export interface IServerError {
  /** The server's routing name ('' when not known). */
  server: string;
  message: string;
}

/** `GET kcoral/api/jobs`: every server's jobs, and the servers that could not answer. */
export interface IJobList {
  jobs: IJob[];
  errors: IServerError[];
}

/** Session states (EXTENSIONS §11). */
export type SessionState = 'STARTING' | 'IDLE' | 'RUNNING' | 'ENDED';

/**
 * One session (EXTENSIONS §11 record; times in Unix seconds), plus what the extension
 * adds: the `server` it came from and `observed_at`, that server's clock when it answered.
 */
export interface ISession {
  session_id: string;
  owner: string;
  /** '' when the server sent no state (or not as a string). */
  state: SessionState | string;
  gpu_count: number | null;
  gpu_ids: number[] | null;
  worker_id: string | null;
  created_at: number | null;
  last_program_finished_at: number | null;
  idle_timeout_seconds: number | null;
  idle_deadline: number | null;
  programs: number | null;
  end_reason: string | null;
  end_message: string | null;
  /** Resident memory of the session's worker, when the server reports it. */
  memory_bytes?: number | null;
  server?: string;
  observed_at?: number | null;
}

/** `GET kcoral/api/sessions`: every server's sessions, and the servers that refused. */
export interface ISessionList {
  sessions: ISession[];
  errors: IServerError[];
}

/** Issues one request below `kcoral/api/` (the plugin adds the base URL and the token). */
export type Fetcher = (path: string, init?: RequestInit) => Promise<Response>;

/** A non-2xx answer of the extension, with the KCoral error kind when there was one. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly kind: string,
    message: string
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

async function errorOf(response: Response): Promise<ApiError> {
  let kind = '';
  let message = `HTTP ${response.status}`;
  try {
    const body = (await response.json()) as unknown;
    const error = isObject(body) && isObject(body.error) ? body.error : {};
    kind = stringOr(error.kind, '');
    message = stringOr(error.message, stringOr(isObject(body) ? body.message : null, message));
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, kind, message);
}

/*
 * Checking what the server extension relays. Servers, jobs and sessions are records that
 * KCoral servers sent as they sent them, and a broken or rogue server may send any JSON:
 * each record is rebuilt here with the types the views read (a field of the wrong type is
 * absent, not passed on), so that no view meets a value it cannot show.
 */

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

const isCount = isFiniteNumber;

function stringOr<T>(value: unknown, otherwise: T): string | T {
  return typeof value === 'string' ? value : otherwise;
}

function countOrNull(value: unknown): number | null {
  return isCount(value) ? value : null;
}

/** The strings of a list a server sent ([] when it is no list). */
function stringList(value: unknown): string[] {
  return Array.isArray(value) ? value.filter((v): v is string => typeof v === 'string') : [];
}

/** GPU ids: the finite numbers of a list, null when the server sent no list. */
function idList(value: unknown): number[] | null {
  return Array.isArray(value) ? value.filter(isCount) : null;
}

/** Only the string values of a map a server sent. */
function stringsOf(value: unknown): Record<string, string> {
  const kept: Record<string, string> = {};
  if (isObject(value)) {
    for (const [key, item] of Object.entries(value)) {
      if (typeof item === 'string') {
        kept[key] = item;
      }
    }
  }
  return kept;
}

/** Only the finite numbers of a map a server sent. */
function countsOf(value: unknown): Record<string, number> {
  const kept: Record<string, number> = {};
  if (isObject(value)) {
    for (const [key, item] of Object.entries(value)) {
      if (isCount(item)) {
        kept[key] = item;
      }
    }
  }
  return kept;
}

/** `/health` with its load counts, else null (the server is shown as unhealthy). */
function checkedHealth(health: unknown): IHealth | null {
  const load = isObject(health) ? health.load : undefined;
  if (
    !isObject(health) ||
    !isObject(load) ||
    !isCount(load.request_capacity) ||
    !isCount(load.requests_in_progress) ||
    !isCount(load.requests_waiting)
  ) {
    return null;
  }
  return {
    status: shownText(health.status),
    instance_id: stringOr(health.instance_id, ''),
    started_at: stringOr(health.started_at, ''),
    gpu_count: countOrNull(health.gpu_count),
    load: {
      request_capacity: load.request_capacity,
      requests_in_progress: load.requests_in_progress,
      requests_waiting: load.requests_waiting
    },
    target: stringsOf(health.target),
    versions: stringsOf(health.versions)
  };
}

function checkedFleetLoad(raw: Record<string, unknown>): IFleetLoad {
  return {
    nodes: countOrNull(raw.nodes),
    seats: countOrNull(raw.seats),
    free_seats: countOrNull(raw.free_seats),
    queued: countOrNull(raw.queued),
    recent_programs: countOrNull(raw.recent_programs),
    estimated_wait_seconds: countOrNull(raw.estimated_wait_seconds)
  };
}

/** A router's `fleet_status`; a label's key or value that is no string is shown as the
 * JSON the router sent (`?` when empty). */
function checkedFleet(raw: unknown): IFleetStatus | undefined {
  if (!isObject(raw)) {
    return undefined;
  }
  const records = (list: unknown): Record<string, unknown>[] =>
    Array.isArray(list) ? list.filter(isObject) : [];
  return {
    kinds: records(raw.kinds).map(kind => ({
      ...checkedFleetLoad(kind),
      gpu: stringOr(kind.gpu, null),
      arch: stringOr(kind.arch, null),
      gpus: countOrNull(kind.gpus),
      default: kind.default === true
    })),
    labels: records(raw.labels).map(label => ({
      ...checkedFleetLoad(label),
      key: shownText(label.key) || '?',
      value: shownText(label.value) || '?'
    })),
    not_ready: records(raw.not_ready).map(kind => ({
      gpu: stringOr(kind.gpu, null),
      arch: stringOr(kind.arch, null),
      gpus: countOrNull(kind.gpus),
      default: kind.default === true,
      states: checkedStates(kind.states)
    }))
  };
}

/** Node counts by state: positive whole numbers only, a state no router names as `other`. */
function checkedStates(raw: unknown): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const [state, count] of Object.entries(isObject(raw) ? raw : {})) {
    if (Number.isSafeInteger(count) && (count as number) > 0) {
      const said = NODE_STATES.includes(state) ? state : 'other';
      counts[said] = (counts[said] ?? 0) + (count as number);
    }
  }
  return counts;
}

function checkedInfo(info: unknown): IInfo | null {
  if (!isObject(info)) {
    return null;
  }
  const seats = info.sessions;
  const fleet = checkedFleet(info.fleet_status);
  return {
    kcoral: stringOr(info.kcoral, ''),
    protocol: countOrNull(info.protocol),
    features: stringList(info.features),
    device: stringOr(info.device, ''),
    sandbox: stringOr(info.sandbox, undefined),
    limits: countsOf(info.limits),
    sessions:
      isObject(seats) && isCount(seats.max) && isCount(seats.active)
        ? {
            max: seats.max,
            active: seats.active,
            idle_timeout_seconds: countOrNull(seats.idle_timeout_seconds)
          }
        : undefined,
    ...(fleet ? { fleet_status: fleet } : {})
  };
}

/**
 * A server entry whose `/health` and `/v1/info` parts (which come from the KCoral server
 * as it sent them) have the types the views read; a malformed `/health` is shown as an
 * unhealthy server rather than breaking the panel. Null without a name.
 */
function checkedServer(raw: unknown): IServerEntry | null {
  if (!isObject(raw) || typeof raw.name !== 'string') {
    return null;
  }
  const health = checkedHealth(raw.health);
  const error = stringOr(raw.error, undefined);
  return {
    name: raw.name,
    ...(typeof raw.label === 'string' ? { label: raw.label } : {}),
    notebooks: stringList(raw.notebooks),
    url: stringOr(raw.url, ''),
    auth: raw.auth === true,
    health,
    info: checkedInfo(raw.info),
    features: stringList(raw.features),
    reachable: raw.reachable === true,
    kernels: stringList(raw.kernels),
    error:
      error ??
      (isObject(raw.health) && !health
        ? 'the server answered /health without its load counts'
        : undefined)
  };
}

/**
 * A job record with the types the jobs table reads: a status that is no string is ''
 * (unknown), GPU ids only the numbers of a list, times only strings. Null without a job
 * id (the record cannot be followed, cancelled or told apart from others).
 */
export function checkedJob(raw: unknown): IJob | null {
  if (!isObject(raw) || typeof raw.job_id !== 'string' || !raw.job_id) {
    return null;
  }
  return {
    job_id: raw.job_id,
    request_id: stringOr(raw.request_id, ''),
    status: stringOr(raw.status, ''),
    submitted_at: stringOr(raw.submitted_at, null),
    started_at: stringOr(raw.started_at, null),
    finished_at: stringOr(raw.finished_at, null),
    worker_id: typeof raw.worker_id === 'string' || isCount(raw.worker_id) ? raw.worker_id : null,
    gpu_ids: idList(raw.gpu_ids),
    target: isObject(raw.target) ? stringsOf(raw.target) : null,
    queue_position: countOrNull(raw.queue_position),
    queue_ms: countOrNull(raw.queue_ms),
    lease_wait_ms: countOrNull(raw.lease_wait_ms),
    lease_held_ms: countOrNull(raw.lease_held_ms),
    elapsed_ms: countOrNull(raw.elapsed_ms),
    error_kind: stringOr(raw.error_kind, null),
    waiting_for: stringOr(raw.waiting_for, null),
    observed_at: countOrNull(raw.observed_at),
    ...(typeof raw.server === 'string' ? { server: raw.server } : {})
  };
}

/** A session record with the types the session cards read (as `checkedJob`); null
 * without a session id. */
export function checkedSession(raw: unknown): ISession | null {
  if (!isObject(raw) || typeof raw.session_id !== 'string' || !raw.session_id) {
    return null;
  }
  return {
    session_id: raw.session_id,
    owner: stringOr(raw.owner, ''),
    state: stringOr(raw.state, ''),
    gpu_count: countOrNull(raw.gpu_count),
    gpu_ids: idList(raw.gpu_ids),
    worker_id: stringOr(raw.worker_id, null),
    created_at: countOrNull(raw.created_at),
    last_program_finished_at: countOrNull(raw.last_program_finished_at),
    idle_timeout_seconds: countOrNull(raw.idle_timeout_seconds),
    idle_deadline: countOrNull(raw.idle_deadline),
    programs: countOrNull(raw.programs),
    end_reason: stringOr(raw.end_reason, null),
    end_message: stringOr(raw.end_message, null),
    memory_bytes: countOrNull(raw.memory_bytes),
    ...(typeof raw.server === 'string' ? { server: raw.server } : {}),
    observed_at: countOrNull(raw.observed_at)
  };
}

/** The `errors` of a list answer: a server's name and a message, as text. */
function checkedErrors(value: unknown): IServerError[] {
  const records = Array.isArray(value) ? value.filter(isObject) : [];
  return records.map(e => ({ server: shownText(e.server), message: shownText(e.message) }));
}

/**
 * Checks each record of a list answer; the records dropped (no id) are counted per server
 * in an error, so the panel says that some were not shown rather than hiding them.
 */
function checkedList<T>(
  value: unknown,
  check: (raw: unknown) => T | null,
  what: string
): { kept: T[]; errors: IServerError[] } {
  const kept: T[] = [];
  const dropped = new Map<string, number>();
  for (const raw of Array.isArray(value) ? value : []) {
    const record = check(raw);
    if (record !== null) {
      kept.push(record);
    } else {
      const server = isObject(raw) ? stringOr(raw.server, '') : '';
      dropped.set(server, (dropped.get(server) ?? 0) + 1);
    }
  }
  const errors = [...dropped].map(([server, count]) => ({
    server,
    message:
      count === 1
        ? `1 ${what} record without a ${what} id is not shown`
        : `${count} ${what} records without a ${what} id are not shown`
  }));
  return { kept, errors };
}

function serverQuery(server: string | undefined): string {
  return server ? `?server=${encodeURIComponent(server)}` : '';
}

/** Client of the server extension's routes. */
export class KCoralApi {
  constructor(private readonly _fetch: Fetcher) {}

  async servers(): Promise<IServerEntry[]> {
    const body = (await this._json('servers')) as { servers?: unknown[] };
    const entries = Array.isArray(body?.servers) ? body.servers : [];
    return entries.map(checkedServer).filter((e): e is IServerEntry => e !== null);
  }

  async jobs(): Promise<IJobList> {
    const body = (await this._json('jobs')) as Record<string, unknown> | null;
    const { kept, errors } = checkedList(body?.jobs, checkedJob, 'job');
    return { jobs: kept, errors: [...checkedErrors(body?.errors), ...errors] };
  }

  async job(id: string, server?: string): Promise<IJob> {
    const job = checkedJob(
      await this._json(`jobs/${encodeURIComponent(id)}${serverQuery(server)}`)
    );
    if (job === null) {
      throw new Error(`the server sent no job record for job ${id}`);
    }
    return job;
  }

  /** Cancels a job (idempotent on the server); returns the job's state afterwards. */
  async cancel(id: string, server?: string): Promise<unknown> {
    return this._json(`jobs/${encodeURIComponent(id)}${serverQuery(server)}`, {
      method: 'DELETE'
    });
  }

  async sessions(): Promise<ISessionList> {
    const body = (await this._json('sessions')) as Record<string, unknown> | null;
    const { kept, errors } = checkedList(body?.sessions, checkedSession, 'session');
    return { sessions: kept, errors: [...checkedErrors(body?.errors), ...errors] };
  }

  /** Ends a session (idempotent on the server); returns its record afterwards (null when
   * the answer was no session record). */
  async stopSession(id: string, server?: string): Promise<ISession | null> {
    return checkedSession(
      await this._json(`sessions/${encodeURIComponent(id)}${serverQuery(server)}`, {
        method: 'DELETE'
      })
    );
  }

  /** Why a finished job failed (its result's error kind and message), null when the
   * answer is no such object. */
  async jobError(id: string, server?: string): Promise<{ kind: string; message: string } | null> {
    const body = await this._json(`jobs/${encodeURIComponent(id)}/error${serverQuery(server)}`);
    if (!isObject(body) || typeof body.message !== 'string') {
      return null;
    }
    return { kind: stringOr(body.kind, ''), message: body.message };
  }

  /** Opens the job's event stream, resuming after `lastEventId` when given. */
  async events(
    id: string,
    lastEventId: string,
    signal: AbortSignal,
    server?: string
  ): Promise<Response> {
    const headers: Record<string, string> = { Accept: 'text/event-stream' };
    if (lastEventId) {
      headers['Last-Event-ID'] = lastEventId;
    }
    const response = await this._fetch(
      `jobs/${encodeURIComponent(id)}/events${serverQuery(server)}`,
      { headers, signal, cache: 'no-store' }
    );
    if (!response.ok) {
      throw await errorOf(response);
    }
    return response;
  }

  private async _json(path: string, init?: RequestInit): Promise<unknown> {
    const response = await this._fetch(path, init);
    if (!response.ok) {
      throw await errorOf(response);
    }
    const text = await response.text();
    return text ? JSON.parse(text) : null;
  }
}
