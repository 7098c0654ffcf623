/**
 * The shared state behind the status bar item and the panel: one poller asks the server
 * extension for the servers and the jobs; views subscribe to changes.
 */

import { IJob, IServerEntry, KCoralApi } from './api';
import { IStatusSummary, newestFirst, summarize } from './format';
import { IVisibility, Poller } from './poller';

export interface IModelOptions {
  pollIntervalMs: number;
  /** The configured server the status bar shows ('' = the first). */
  statusServer: string;
  maxIntervalMs?: number;
  visibility?: IVisibility;
}

export class KCoralModel {
  /** `null` until the first answer, and while the server extension cannot be reached. */
  servers: IServerEntry[] | null = null;
  jobs: IJob[] = [];
  jobErrors: { server: string; message: string }[] = [];
  statusServer: string;

  readonly poller: Poller;
  private readonly _listeners = new Set<() => void>();

  constructor(
    readonly api: KCoralApi,
    options: IModelOptions
  ) {
    this.statusServer = options.statusServer;
    this.poller = new Poller({
      task: () => this.poll(),
      intervalMs: options.pollIntervalMs,
      maxIntervalMs: options.maxIntervalMs ?? 60_000,
      visibility: options.visibility
    });
  }

  get summary(): IStatusSummary {
    return summarize(this.servers, this.statusServer);
  }

  /** Calls `listener` after every poll; returns a function that unsubscribes. */
  subscribe(listener: () => void): () => void {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  start(): void {
    this.poller.start();
  }

  dispose(): void {
    this.poller.stop();
    this._listeners.clear();
  }

  configure(pollIntervalMs: number, statusServer: string): void {
    this.statusServer = statusServer;
    this.poller.setInterval(pollIntervalMs);
    this._emit();
  }

  /** The latest record of one job. */
  job(id: string): IJob | undefined {
    return this.jobs.find(job => job.job_id === id);
  }

  /**
   * One poll. Rejects when the server extension or the status bar's server cannot be
   * reached, so the poller backs off; the state is updated either way.
   */
  async poll(): Promise<void> {
    const [servers, jobs] = await Promise.allSettled([this.api.servers(), this.api.jobs()]);
    this.servers = servers.status === 'fulfilled' ? servers.value : null;
    if (jobs.status === 'fulfilled') {
      this.jobs = newestFirst(jobs.value.jobs);
      this.jobErrors = jobs.value.errors;
    }
    this._emit();
    if (servers.status === 'rejected') {
      throw servers.reason;
    }
    if (!this.summary.online) {
      throw new Error(this.summary.reason);
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
