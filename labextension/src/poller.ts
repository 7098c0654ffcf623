/**
 * Periodic polling with exponential back-off on failure and a pause while the page is
 * hidden (a background tab should not keep asking a GPU server how busy it is).
 */

/** Where the poller learns whether the page is hidden; injected so tests can drive it. */
export interface IVisibility {
  hidden(): boolean;
  /** Calls `listener` on every change; returns a function that unsubscribes. */
  onChange(listener: () => void): () => void;
}

/** A page that is never hidden (tests, or no `document`). */
export const alwaysVisible: IVisibility = {
  hidden: () => false,
  onChange: () => () => undefined
};

/** The browser page's visibility (`document.visibilityState`). */
export function documentVisibility(doc: Document): IVisibility {
  return {
    hidden: () => doc.visibilityState === 'hidden',
    onChange: listener => {
      doc.addEventListener('visibilitychange', listener);
      return () => doc.removeEventListener('visibilitychange', listener);
    }
  };
}

export interface IPollerOptions {
  /** One poll; a rejection counts as a failure and backs off. */
  task: () => Promise<void>;
  intervalMs: number;
  /** Upper bound of the delay after repeated failures. */
  maxIntervalMs?: number;
  /** Delay multiplier per consecutive failure. */
  backoffFactor?: number;
  visibility?: IVisibility;
}

/** Runs `task` now and then every `intervalMs`; never two tasks at once. */
export class Poller {
  private _intervalMs: number;
  private readonly _maxIntervalMs: number;
  private readonly _factor: number;
  private readonly _visibility: IVisibility;
  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _running = false;
  private _started = false;
  private _again = false;
  private _failures = 0;
  private _delayMs: number;
  private _unsubscribe: (() => void) | null = null;

  constructor(private readonly _options: IPollerOptions) {
    this._intervalMs = _options.intervalMs;
    this._maxIntervalMs = Math.max(_options.maxIntervalMs ?? 60_000, _options.intervalMs);
    this._factor = Math.max(_options.backoffFactor ?? 2, 1);
    this._visibility = _options.visibility ?? alwaysVisible;
    this._delayMs = this._intervalMs;
  }

  /** Consecutive failed polls. */
  get failures(): number {
    return this._failures;
  }

  /** The delay before the next poll (grows while polls fail). */
  get delayMs(): number {
    return this._delayMs;
  }

  /** Whether a poll is waiting on its timer (false while paused or stopped). */
  get scheduled(): boolean {
    return this._timer !== null;
  }

  get started(): boolean {
    return this._started;
  }

  start(): void {
    if (this._started) {
      return;
    }
    this._started = true;
    this._unsubscribe = this._visibility.onChange(() => this._visibilityChanged());
    void this._tick();
  }

  stop(): void {
    this._started = false;
    this._clear();
    this._unsubscribe?.();
    this._unsubscribe = null;
  }

  /** Polls now (after the poll in flight, if any) and resets the timer. */
  refresh(): Promise<void> {
    if (!this._started) {
      return Promise.resolve();
    }
    if (this._running) {
      this._again = true;
      return Promise.resolve();
    }
    return this._tick();
  }

  /** Changes the interval; takes effect from the next scheduled poll. */
  setInterval(ms: number): void {
    this._intervalMs = ms;
    if (this._failures === 0) {
      this._delayMs = ms;
      if (this._timer !== null) {
        this._schedule();
      }
    }
  }

  private _visibilityChanged(): void {
    if (!this._started) {
      return;
    }
    if (this._visibility.hidden()) {
      this._clear();
    } else if (!this._running) {
      // Back on screen: show fresh numbers at once instead of waiting out the timer.
      void this._tick();
    }
  }

  private async _tick(): Promise<void> {
    this._clear();
    if (!this._started || this._visibility.hidden()) {
      return;
    }
    this._running = true;
    try {
      await this._options.task();
      this._failures = 0;
      this._delayMs = this._intervalMs;
    } catch {
      this._failures++;
      const grown = this._intervalMs * Math.pow(this._factor, this._failures);
      this._delayMs = Math.min(grown, this._maxIntervalMs);
    } finally {
      this._running = false;
    }
    if (this._again) {
      this._again = false;
      return this._tick();
    }
    this._schedule();
  }

  private _schedule(): void {
    this._clear();
    if (!this._started || this._visibility.hidden()) {
      return;
    }
    this._timer = setTimeout(() => {
      this._timer = null;
      void this._tick();
    }, this._delayMs);
  }

  private _clear(): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
  }
}
