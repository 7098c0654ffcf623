import { JobEvent } from '../sse';
import { followJobEvents } from '../stream';
import { sse, streamResponse } from './helpers';

function collect(): { events: JobEvent[]; onEvent: (e: JobEvent) => void } {
  const events: JobEvent[] = [];
  return { events, onEvent: e => events.push(e) };
}

const text = (events: JobEvent[]) =>
  events.map(e => (e.kind === 'stdout' || e.kind === 'stderr' ? e.text : '')).join('');

describe('followJobEvents', () => {
  it('delivers events in order and stops at the finished phase', async () => {
    const { events, onEvent } = collect();
    const open = jest.fn(async () =>
      streamResponse([
        sse('phase', 1, { phase: 'queued', position: 1 }),
        sse('stdout', 2, 'hello ') + sse('stdout', 3, 'world'),
        sse('phase', 4, { phase: 'finished', status: 'COMPLETED' }),
        sse('stdout', 5, 'never read')
      ])
    );
    const end = await followJobEvents({ open, onEvent, signal: new AbortController().signal });
    expect(end).toBe('finished');
    expect(open).toHaveBeenCalledTimes(1);
    expect(events.map(e => e.kind)).toEqual(['phase', 'stdout', 'stdout', 'phase']);
    expect(text(events)).toBe('hello world');
  });

  it('decodes a multi-byte character split across two reads', async () => {
    const { events, onEvent } = collect();
    const bytes = new TextEncoder().encode(sse('stdout', 1, 'π≈3') + sse('phase', 2, { phase: 'finished' }));
    const piIndex = bytes.indexOf(0xcf);
    const open = async () =>
      streamResponse([bytes.slice(0, piIndex + 1), bytes.slice(piIndex + 1)]);
    await followJobEvents({ open, onEvent, signal: new AbortController().signal });
    expect(text(events)).toBe('π≈3');
  });

  it('reconnects with the last event id when the stream drops, losing and repeating nothing', async () => {
    const { events, onEvent } = collect();
    const seen: string[] = [];
    const open = jest.fn(async (last: string) => {
      seen.push(last);
      if (last === '') {
        return streamResponse([sse('stdout', 1, 'a'), sse('stdout', 2, 'b'), 'event: stdout\nid: 3\nda']);
      }
      return streamResponse([sse('stdout', 3, 'c'), sse('phase', 4, { phase: 'finished' })]);
    });
    const end = await followJobEvents({
      open,
      onEvent,
      signal: new AbortController().signal,
      retryDelayMs: 1
    });
    expect(end).toBe('finished');
    expect(seen).toEqual(['', '2']);
    expect(text(events)).toBe('abc');
  });

  it('gives up after repeated connection failures and reports the error', async () => {
    const onError = jest.fn();
    const open = jest.fn(async () => {
      throw new TypeError('network down');
    });
    const end = await followJobEvents({
      open,
      onEvent: () => undefined,
      onError,
      signal: new AbortController().signal,
      retryDelayMs: 1,
      maxAttempts: 3
    });
    expect(end).toBe('failed');
    expect(open).toHaveBeenCalledTimes(3);
    expect(onError.mock.calls[0][0].message).toBe('network down');
  });

  it('does not retry an answer such as 404 job_expired', async () => {
    const error = Object.assign(new Error('job expired'), { status: 404 });
    const open = jest.fn(async () => {
      throw error;
    });
    const onError = jest.fn();
    const end = await followJobEvents({
      open,
      onEvent: () => undefined,
      onError,
      signal: new AbortController().signal,
      retryDelayMs: 1
    });
    expect(end).toBe('failed');
    expect(open).toHaveBeenCalledTimes(1);
    expect(onError).toHaveBeenCalledWith(error);
  });

  it('ends quietly when aborted while waiting to reconnect', async () => {
    const controller = new AbortController();
    const open = jest.fn(async () => streamResponse([sse('stdout', 1, 'x')]));
    const follow = followJobEvents({
      open,
      onEvent: () => controller.abort(),
      signal: controller.signal,
      retryDelayMs: 60_000
    });
    await expect(follow).resolves.toBe('aborted');
    expect(open).toHaveBeenCalledTimes(1);
  });
});
