/**
 * Following one job's event stream: read the fetch body as it arrives, decode events, and
 * reconnect with `Last-Event-ID` when the stream drops before the job finished, so the
 * output shown is complete and nothing is shown twice.
 */

import { decodeJobEvent, isFinished, JobEvent, SseParser } from './sse';

/** How a follow ended. */
export type FollowEnd = 'finished' | 'aborted' | 'failed';

export interface IFollowOptions {
  /** Opens the stream; resolves to the response whose body carries the events. */
  open: (lastEventId: string, signal: AbortSignal) => Promise<Response>;
  onEvent: (event: JobEvent) => void;
  signal: AbortSignal;
  /** Delay before a reconnect (the server's `retry` advice wins when it gave one). */
  retryDelayMs?: number;
  /** Consecutive failed connections before giving up. */
  maxAttempts?: number;
  /** Called with the error that ended the follow (`failed`). */
  onError?: (error: unknown) => void;
  /** Resume after this event id (a follow that failed before, taken up again): what was
   * shown already is not sent again. */
  lastEventId?: string;
}

/** Whether asking again may change the answer that ended a follow: not for a 4xx such as
 * 404 `job_expired`; yes for no answer or a 5xx (the job's server not reachable through
 * the server extension). */
export function isRetryable(error: unknown): boolean {
  const status = (error as { status?: unknown } | null)?.status;
  return !(typeof status === 'number' && status >= 400 && status < 500);
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise(resolve => {
    if (signal.aborted) {
      resolve();
      return;
    }
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done);
  });
}

/** Follows the stream until the `finished` phase, an abort, or repeated failures. */
export async function followJobEvents(options: IFollowOptions): Promise<FollowEnd> {
  const { signal } = options;
  const maxAttempts = options.maxAttempts ?? 5;
  const parser = new SseParser();
  parser.lastEventId = options.lastEventId ?? '';
  let failures = 0;
  let lastError: unknown = null;
  while (!signal.aborted) {
    let progressed = false;
    parser.reset();
    try {
      const response = await options.open(parser.lastEventId, signal);
      if (!response.body) {
        throw new Error('the event stream has no body');
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder('utf-8');
      try {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) {
            break;
          }
          for (const message of parser.feed(decoder.decode(value, { stream: true }))) {
            const event = decodeJobEvent(message);
            progressed = true;
            options.onEvent(event);
            if (isFinished(event)) {
              await reader.cancel().catch(() => undefined);
              return 'finished';
            }
          }
        }
      } finally {
        reader.releaseLock();
      }
      lastError = new Error('the event stream ended before the job finished');
    } catch (error) {
      if (signal.aborted) {
        break;
      }
      lastError = error;
      // An answer such as 404 job_expired will not change by asking again.
      if (!isRetryable(error)) {
        options.onError?.(error);
        return 'failed';
      }
    }
    failures = progressed ? 0 : failures + 1;
    if (failures >= maxAttempts) {
      options.onError?.(lastError);
      return 'failed';
    }
    await sleep(parser.retryMs ?? options.retryDelayMs ?? 1000, signal);
  }
  return 'aborted';
}
