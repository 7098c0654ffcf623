/**
 * The shared state behind the status bar item and the panel: one `@lumino/polling` Poll
 * (what jupyter-resource-usage uses) asks the server extension for the servers, the jobs
 * and the sessions, backing off while that fails and standing by while the page is hidden
 * (a background tab should not keep asking a GPU server how busy it is); views subscribe
 * to changes.
 */

import { Poll } from '@lumino/polling';

import { IJob, ISession, IServerEntry, KCoralApi } from './api';
import {
  IStatusSummary,
  newestFirst,
  orderSessions,
  summarize,
  Unreached,
  unreachedKind
} from './format';

/** How long the servers' answer waits for the jobs and sessions before it is shown alone. */
const SERVERS_ALONE_AFTER_MS = 300;

/** Resolves once `promise` has settled, or after `ms`, whichever comes first. */
function settledWithin(promise: Promise<unknown>, ms: number): Promise<void> {
  return new Promise(resolve => {
    const timer = setTimeout(resolve, ms);
    void promise.then(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}

export interface IModelOptions {
  pollIntervalMs: number;
  /** The configured server the status bar shows ('' = the first). */
  statusServer: string;
  /** Upper bound of the delay after repeated failures (default 60 s). */
  maxIntervalMs?: number;
  /** When polling stands by (default: while the page is hidden); injected by tests. */
  standby?: Poll.Standby | (() => boolean | Poll.Standby);
}

export class KCoralModel {
  /** `null` until the first answer, and while the server extension cannot be reached. */
  servers: IServerEntry[] | null = null;
  /** Why the last poll could not read the servers (meaningful while `servers` is null);
   * the jobs and sessions then are those of the last poll that read them. */
  unreached: Unreached = 'no-answer';
  jobs: IJob[] = [];
  jobErrors: { server: string; message: string }[] = [];
  /** Live sessions first, then recently ended ones (EXTENSIONS §11). */
  sessions: ISession[] = [];
  sessionErrors: { server: string; message: string }[] = [];
  statusServer: string;
  /** The kernel of the notebook in focus (null: no notebook, or no kernel yet). */
  focusedKernel: string | null = null;

  readonly poller: Poll;
  private readonly _listeners = new Set<() => void>();

  constructor(
    readonly api: KCoralApi,
    options: IModelOptions
  ) {
    this.statusServer = options.statusServer;
    this.poller = new Poll({
      auto: false,
      factory: () => this.poll(),
      frequency: {
        interval: options.pollIntervalMs,
        backoff: true,
        max: Math.max(options.maxIntervalMs ?? 60_000, options.pollIntervalMs)
      },
      name: 'kcoral:servers-and-jobs',
      standby: options.standby ?? 'when-hidden'
    });
  }

  get summary(): IStatusSummary {
    return summarize(this.servers, this.statusServer, this.focusedKernel, this.unreached);
  }

  /** The notebook in focus changed, or its kernel did: show that kernel's server. */
  setFocusedKernel(kernelId: string | null): void {
    if (kernelId !== this.focusedKernel) {
      this.focusedKernel = kernelId;
      this._emit();
      if (kernelId !== null) {
        void this.poller.refresh(); // a kernel that just connected is worth asking about
      }
    }
  }

  /** Calls `listener` after every poll; returns a function that unsubscribes. */
  subscribe(listener: () => void): () => void {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  start(): void {
    void this.poller.start();
  }

  dispose(): void {
    this.poller.dispose();
    this._listeners.clear();
  }

  configure(pollIntervalMs: number, statusServer: string): void {
    this.statusServer = statusServer;
    const frequency = this.poller.frequency;
    this.poller.frequency = {
      ...frequency,
      interval: pollIntervalMs,
      max: Math.max(frequency.max, pollIntervalMs)
    };
    this._emit();
  }

  /** The latest record of one job. */
  job(id: string): IJob | undefined {
    return this.jobs.find(job => job.job_id === id);
  }

  /**
   * One poll. Rejects when the server extension cannot be reached, so the poller backs
   * off; the state is updated either way. A KCoral server that cannot be reached is not a
   * failed poll: the extension said so at once (or after its timeout), the other servers'
   * jobs must stay live, and that server must show as back within one interval of its
   * return (backing off for it left a healthy server's jobs up to a minute stale, and an
   * offline status bar as long).
   */
  async poll(): Promise<void> {
    const servers = this.api.servers().then(
      value => ({ value, reason: null }),
      (reason: unknown) => ({ value: null, reason: reason ?? new Error('no answer') })
    );
    let shown = false;
    const lists = Promise.allSettled([
      this.api.jobs().then(list => {
        this.jobs = newestFirst(list.jobs);
        this.jobErrors = list.errors;
        if (shown) this._emit();
      }),
      this.api.sessions().then(list => {
        this.sessions = orderSessions(list.sessions);
        this.sessionErrors = list.errors;
        if (shown) this._emit();
      })
    ]);
    const answer = await servers;
    this.servers = answer.value;
    if (answer.reason !== null) {
      this.unreached = unreachedKind(answer.reason);
    }
    // One update for what answers together, but the servers do not wait for the jobs and
    // sessions past a moment: a server that holds those routes up (a router relaying them
    // to a node that stopped answering, for the whole request timeout) kept every card and
    // the status bar at their last answer, `health ok` while the router said unavailable.
    await settledWithin(lists, SERVERS_ALONE_AFTER_MS);
    shown = true;
    this._emit();
    await lists;
    if (answer.reason !== null) {
      throw answer.reason;
    }
  }

  private _emit(): void {
    for (const listener of [...this._listeners]) {
      try {
        listener();
      } catch (error) {
        console.error('KCoral: a view failed to update', error);
      }
    }
  }
}
