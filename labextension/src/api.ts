/**
 * The REST API of the KCoral Jupyter server extension (`{base_url}kcoral/api/`): typed
 * records and a thin client over an injected fetch function, so tests need no JupyterLab.
 */

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
  protocol: number;
  features: string[];
  device: string;
  /** The mode programs run in (EXTENSIONS §1); absent on servers before 2026-12. */
  sandbox?: string;
  limits?: Record<string, number>;
  /** Session seats (EXTENSIONS §11); absent on servers without the `sessions` feature. */
  sessions?: { max: number; active: number; idle_timeout_seconds: number };
  /** A router's fleet now (ROUTER §6): absent from a direct server. */
  fleet_status?: IFleetStatus;
}

/** What one part of a router's fleet holds now (ROUTER §6 `fleet_status`). */
export interface IFleetLoad {
  nodes: number;
  seats: number;
  free_seats: number;
  queued: number;
  recent_programs: number;
  /** An estimate; null without recent programs. */
  estimated_wait_seconds: number | null;
}

/** A router's `/v1/info` `fleet_status`: per GPU kind (the default first), per label. */
export interface IFleetStatus {
  kinds: (IFleetLoad & {
    gpu: string | null;
    arch: string | null;
    gpus: number;
    default: boolean;
  })[];
  labels: (IFleetLoad & { key: string; value: string })[];
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
  server?: string;
}

/** `GET kcoral/api/jobs`: every server's jobs, and the servers that could not answer. */
export interface IJobList {
  jobs: IJob[];
  errors: { server: string; message: string }[];
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
  errors: { server: string; message: string }[];
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
    const body = (await response.json()) as {
      error?: { kind?: string; message?: string };
      message?: string;
    };
    kind = body?.error?.kind ?? '';
    message = body?.error?.message ?? body?.message ?? message;
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, kind, message);
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isFinite(value);
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

/**
 * A server entry whose `/health` and `/v1/info` parts (which come from the KCoral server
 * as it sent them) have the types the views read; a malformed `/health` is shown as an
 * unhealthy server rather than breaking the panel. Null without a name.
 */
function checkedServer(raw: unknown): IServerEntry | null {
  if (!isObject(raw) || typeof raw.name !== 'string') {
    return null;
  }
  const entry = raw as unknown as IServerEntry;
  const health = raw.health;
  const load = isObject(health) ? health.load : undefined;
  const healthy =
    isObject(health) &&
    isObject(load) &&
    isCount(load.request_capacity) &&
    isCount(load.requests_in_progress) &&
    isCount(load.requests_waiting);
  const info = isObject(raw.info) ? raw.info : null;
  const seats = info?.sessions;
  return {
    ...entry,
    url: typeof raw.url === 'string' ? raw.url : '',
    health: healthy
      ? {
          ...(health as unknown as IHealth),
          status: String(health.status),
          target: stringsOf(health.target),
          versions: stringsOf(health.versions)
        }
      : null,
    info: info
      ? {
          ...(info as unknown as IInfo),
          kcoral: typeof info.kcoral === 'string' ? info.kcoral : '',
          sandbox: typeof info.sandbox === 'string' ? info.sandbox : undefined,
          device: typeof info.device === 'string' ? info.device : '',
          sessions:
            isObject(seats) && isCount(seats.max) && isCount(seats.active)
              ? (seats as IInfo['sessions'])
              : undefined
        }
      : null,
    features: Array.isArray(raw.features)
      ? raw.features.filter((f): f is string => typeof f === 'string')
      : [],
    kernels: Array.isArray(raw.kernels)
      ? raw.kernels.filter((k): k is string => typeof k === 'string')
      : [],
    error:
      typeof raw.error === 'string'
        ? raw.error
        : isObject(health) && !healthy
          ? 'the server answered /health without its load counts'
          : undefined
  };
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
    const body = (await this._json('jobs')) as Partial<IJobList>;
    return {
      jobs: Array.isArray(body?.jobs) ? body.jobs : [],
      errors: Array.isArray(body?.errors) ? body.errors : []
    };
  }

  async job(id: string, server?: string): Promise<IJob> {
    return (await this._json(`jobs/${encodeURIComponent(id)}${serverQuery(server)}`)) as IJob;
  }

  /** Cancels a job (idempotent on the server); returns the job's state afterwards. */
  async cancel(id: string, server?: string): Promise<unknown> {
    return this._json(`jobs/${encodeURIComponent(id)}${serverQuery(server)}`, {
      method: 'DELETE'
    });
  }

  async sessions(): Promise<ISessionList> {
    const body = (await this._json('sessions')) as Partial<ISessionList>;
    // Records come from KCoral servers, which may send anything: keep those with an id.
    const records: unknown[] = Array.isArray(body?.sessions) ? body.sessions : [];
    return {
      sessions: records.filter(
        (r): r is ISession =>
          typeof r === 'object' && r !== null && typeof (r as ISession).session_id === 'string'
      ),
      errors: Array.isArray(body?.errors) ? body.errors : []
    };
  }

  /** Ends a session (idempotent on the server); returns its record afterwards. */
  async stopSession(id: string, server?: string): Promise<ISession> {
    return (await this._json(`sessions/${encodeURIComponent(id)}${serverQuery(server)}`, {
      method: 'DELETE'
    })) as ISession;
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
