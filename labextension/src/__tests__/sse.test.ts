import {
  decodeJobEvent,
  isFinished,
  MAX_EVENT_DATA_LINES,
  MAX_LINE,
  SseParser
} from '../sse';

describe('SseParser', () => {
  it('dispatches a message at the blank line that ends it', () => {
    const parser = new SseParser();
    expect(parser.feed('event: stdout\nid: 1\ndata: "hi"\n')).toEqual([]);
    expect(parser.feed('\n')).toEqual([{ event: 'stdout', data: '"hi"', id: '1' }]);
  });

  it('reassembles a message split at any byte position across chunks', () => {
    const stream = 'id: 7\r\nevent: phase\r\ndata: {"phase":"queued",\r\ndata: "position":2}\r\n\r\n';
    for (let cut = 0; cut <= stream.length; cut++) {
      const parser = new SseParser();
      const messages = [...parser.feed(stream.slice(0, cut)), ...parser.feed(stream.slice(cut))];
      expect(messages).toEqual([
        { event: 'phase', data: '{"phase":"queued",\n"position":2}', id: '7' }
      ]);
    }
  });

  it('accepts LF, CRLF and lone CR line endings', () => {
    const parser = new SseParser();
    const messages = parser.feed('data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\n\n');
    expect(messages.map(m => m.data)).toEqual(['a', 'b', 'c', 'd']);
  });

  it('ignores comments, unknown fields and messages without data', () => {
    const parser = new SseParser();
    const messages = parser.feed(': keep-alive\nfoo: bar\n\nevent: x\n\ndata\n\n');
    expect(messages).toEqual([{ event: 'message', data: '', id: '' }]);
  });

  it('keeps the last event id across messages and reads the retry advice', () => {
    const parser = new SseParser();
    const messages = parser.feed('id: 3\nretry: 2500\ndata: a\n\ndata: b\n\n');
    expect(messages.map(m => m.id)).toEqual(['3', '3']);
    expect(parser.lastEventId).toBe('3');
    expect(parser.retryMs).toBe(2500);
  });

  it('removes exactly one space after the colon', () => {
    const parser = new SseParser();
    expect(parser.feed('data:  two\n\ndata:none\n\n').map(m => m.data)).toEqual([
      ' two',
      'none'
    ]);
  });
});

describe('decodeJobEvent', () => {
  it('reads output text from a JSON string, a JSON object or raw data', () => {
    const text = (data: string) => decodeJobEvent({ event: 'stdout', data, id: '1' });
    expect(text('"a\\nb"')).toEqual({ kind: 'stdout', id: '1', text: 'a\nb' });
    expect(text('{"text": "é"}')).toEqual({ kind: 'stdout', id: '1', text: 'é' });
    expect(text('plain words')).toEqual({ kind: 'stdout', id: '1', text: 'plain words' });
    expect(decodeJobEvent({ event: 'stderr', data: '{"data":"oops"}', id: '2' })).toEqual({
      kind: 'stderr',
      id: '2',
      text: 'oops'
    });
  });

  it('splits a phase event into its name and its other fields', () => {
    const event = decodeJobEvent({
      event: 'phase',
      data: '{"phase": "instruction", "index": 2, "op": "run", "id": "r"}',
      id: '9'
    });
    expect(event).toEqual({
      kind: 'phase',
      id: '9',
      phase: 'instruction',
      fields: { index: 2, op: 'run', id: 'r' }
    });
    expect(isFinished(event)).toBe(false);
  });

  it('recognises the finished phase, in JSON or as a bare word', () => {
    const json = decodeJobEvent({
      event: 'phase',
      data: '{"phase":"finished","status":"COMPLETED"}',
      id: '5'
    });
    expect(isFinished(json)).toBe(true);
    expect(isFinished(decodeJobEvent({ event: 'phase', data: 'finished', id: '' }))).toBe(true);
  });

  it('keeps heartbeats and unknown events apart from output', () => {
    expect(decodeJobEvent({ event: 'heartbeat', data: '{}', id: '4' })).toEqual({
      kind: 'heartbeat',
      id: '4'
    });
    expect(decodeJobEvent({ event: 'message', data: 'x', id: '' }).kind).toBe('other');
  });
});

describe('SseParser ids across a broken connection', () => {
  it('counts an id only once its message is complete, and reset drops the partial message', () => {
    const parser = new SseParser();
    parser.feed('id: 1\ndata: a\n\nid: 2\ndata: b');
    expect(parser.lastEventId).toBe('1');
    parser.reset();
    expect(parser.feed('\n\nid: 2\ndata: b\n\n')).toEqual([{ event: 'message', data: 'b', id: '2' }]);
  });
});

// A hostile server (any server the panel lists) sends what no KCoral server sends. The
// parser kept a line without an end in one string that it scanned and copied again with
// every chunk: 64 MiB of it held the browser tab for minutes, and nothing bounded it.
describe('SseParser against a hostile event stream', () => {
  const chunk = 'x'.repeat(64 * 1024);

  it('refuses a line other than data: once it passes 1 MiB, without waiting for its end', () => {
    const parser = new SseParser();
    parser.feed('id: ');
    const fed = (): void => {
      for (let i = 0; i < MAX_LINE / chunk.length + 1; i++) {
        parser.feed(chunk);
      }
    };
    expect(fed).toThrow('job event stream line over 1 MiB');
  });

  it('refuses an event of more than 1,024 data lines', () => {
    const parser = new SseParser();
    parser.feed('data: a\n'.repeat(MAX_EVENT_DATA_LINES));
    expect(() => parser.feed('data: a\n')).toThrow('job event over 1024 data lines');
  });

  it('still takes a data line longer than 1 MiB, fed a piece at a time', () => {
    const parser = new SseParser();
    parser.feed('data: ');
    for (let i = 0; i < 64; i++) {
      parser.feed(chunk);
    }
    const [message] = parser.feed('\n\n');
    expect(message.data.length).toBe(64 * chunk.length);
  });
});
