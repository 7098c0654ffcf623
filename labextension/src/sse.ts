/**
 * Server-Sent Events: an incremental parser (WHATWG "event stream interpretation") and the
 * decoding of KCoral job events (EXTENSIONS §5) into small typed records.
 *
 * The browser's EventSource cannot send the Jupyter token header nor `Last-Event-ID` on our
 * own schedule, so the panel reads the stream with fetch and parses it here.
 */

import { shownText } from './text';

/** One dispatched SSE message. */
export interface ISseMessage {
  /** The `event` field, `message` when absent. */
  event: string;
  /** The `data` lines joined with `\n`. */
  data: string;
  /** The last event id in force when this message was dispatched ('' if none). */
  id: string;
}

/** Bounds on an event stream (EXTENSIONS §5, as the Python client's): a line other than
 * `data:` (ids, event names, comments); a `data:` line, and one event's data; the `data:`
 * lines of one event. In characters here, where the client counts bytes. */
export const MAX_LINE = 1 << 20;
export const MAX_EVENT_DATA = 256 << 20;
export const MAX_EVENT_DATA_LINES = 1024;

/** Throws when a line of `length` characters starting with `head` is over its bound. */
function checkLine(length: number, head: string): void {
  if (length <= MAX_LINE) {
    return;
  }
  if (!head.startsWith('data:')) {
    throw new Error(`job event stream line over ${MAX_LINE >> 20} MiB`);
  }
  if (length > MAX_EVENT_DATA) {
    throw new Error(`job event data over ${MAX_EVENT_DATA >> 20} MiB`);
  }
}

/** Incremental SSE parser: feed decoded text chunks, get complete messages. */
export class SseParser {
  /** The id of the last dispatched message (kept across messages for a reconnect). */
  lastEventId = '';
  /** The server's `retry` advice in milliseconds, when it gave one. */
  retryMs: number | null = null;

  // The line not ended yet, in pieces: one string grown chunk by chunk was scanned and
  // copied again for every chunk (a line of 64 MiB without an end held the tab ~3 min).
  private _partial: string[] = [];
  private _partialLength = 0;
  private _partialHead = ''; // its first characters: whether it is a `data:` line
  private _dataLength = 0;
  private _idBuffer = '';
  private _event = '';
  private _data: string[] = [];
  private _hasData = false;
  private _pendingCr = false;

  /** Drops a partly received message (the connection broke); ids already dispatched stay. */
  reset(): void {
    this._partial = [];
    this._partialLength = 0;
    this._partialHead = '';
    this._idBuffer = this.lastEventId;
    this._event = '';
    this._data = [];
    this._dataLength = 0;
    this._hasData = false;
    this._pendingCr = false;
  }

  /** Parses one chunk; a message split across chunks comes out with the chunk ending it.
   * Throws past the bounds of EXTENSIONS §5 (a line other than `data:` over 1 MiB, a `data:`
   * line or an event's data over 256 MiB, more than 1,024 `data:` lines in one event), as
   * soon as they are passed; the time taken is linear in what arrives. */
  feed(chunk: string): ISseMessage[] {
    const messages: ISseMessage[] = [];
    let text = chunk;
    // A CR ending the previous chunk may be the first half of a CRLF.
    if (this._pendingCr && text.startsWith('\n')) {
      text = text.slice(1);
    }
    this._pendingCr = false;
    let start = 0;
    for (let i = 0; i < text.length; i++) {
      const ch = text[i];
      if (ch !== '\n' && ch !== '\r') {
        continue;
      }
      const line = this._take(text.slice(start, i));
      if (ch === '\r') {
        if (i + 1 < text.length) {
          if (text[i + 1] === '\n') {
            i++;
          }
        } else {
          this._pendingCr = true;
        }
      }
      start = i + 1;
      const message = this._line(line);
      if (message) {
        messages.push(message);
      }
    }
    if (start < text.length) {
      const rest = text.slice(start);
      this._partial.push(rest);
      this._partialLength += rest.length;
      if (this._partialHead.length < 5) {
        this._partialHead = (this._partialHead + rest).slice(0, 5);
      }
      checkLine(this._partialLength, this._partialHead);
    }
    return messages;
  }

  /** The line ending with `end`: the pieces kept so far and `end`, within its bound. */
  private _take(end: string): string {
    const line = this._partial.length ? this._partial.join('') + end : end;
    this._partial = [];
    this._partialLength = 0;
    this._partialHead = '';
    checkLine(line.length, line.slice(0, 5));
    return line;
  }

  private _line(line: string): ISseMessage | null {
    if (line === '') {
      return this._dispatch();
    }
    if (line.startsWith(':')) {
      return null; // a comment (keep-alive)
    }
    const colon = line.indexOf(':');
    let field = line;
    let value = '';
    if (colon >= 0) {
      field = line.slice(0, colon);
      value = line.slice(colon + 1);
      if (value.startsWith(' ')) {
        value = value.slice(1);
      }
    }
    switch (field) {
      case 'event':
        this._event = value;
        break;
      case 'data':
        this._dataLength += value.length + 1;
        if (this._data.length >= MAX_EVENT_DATA_LINES || this._dataLength > MAX_EVENT_DATA) {
          throw new Error(
            `job event over ${MAX_EVENT_DATA_LINES} data lines or ${MAX_EVENT_DATA >> 20} MiB of data`
          );
        }
        this._data.push(value);
        this._hasData = true;
        break;
      case 'id':
        if (!value.includes('\0')) {
          this._idBuffer = value;
        }
        break;
      case 'retry':
        if (/^\d+$/.test(value)) {
          this.retryMs = Number(value);
        }
        break;
      default:
        break; // unknown fields are ignored, as the standard says
    }
    return null;
  }

  private _dispatch(): ISseMessage | null {
    // The id counts only once its message is complete: a reconnect after a message cut
    // in half must ask for that message again.
    this.lastEventId = this._idBuffer;
    const event = this._event || 'message';
    const hasData = this._hasData;
    const data = this._data.join('\n');
    this._event = '';
    this._data = [];
    this._dataLength = 0;
    this._hasData = false;
    if (!hasData) {
      return null;
    }
    return { event, data, id: this.lastEventId };
  }
}

/** A value of a phase event's field, as `decodeJobEvent` keeps it. */
export type PhaseField = string | number | boolean | null;

/** A job event (EXTENSIONS §5 `GET /v1/jobs/{id}/events`). */
export type JobEvent =
  | {
      kind: 'phase';
      id: string;
      phase: string;
      /** The other fields of the phase event: position, worker_id, index, op, status...;
       * strings, numbers, booleans and null as sent, anything else as its JSON text. */
      fields: Record<string, PhaseField>;
    }
  | { kind: 'stdout' | 'stderr'; id: string; text: string }
  | { kind: 'heartbeat'; id: string }
  | { kind: 'other'; id: string; event: string; data: string };

function parseJson(data: string): unknown {
  try {
    return JSON.parse(data);
  } catch {
    return undefined;
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The fields of a phase event with the types `PhaseField` allows: an object or a list a
 * server sent in one (which the output pane could not show as it is) becomes its JSON. */
function phaseFields(value: Record<string, unknown>): Record<string, PhaseField> {
  const fields: Record<string, PhaseField> = {};
  for (const [key, item] of Object.entries(value)) {
    fields[key] =
      item === null || ['string', 'number', 'boolean'].includes(typeof item)
        ? (item as PhaseField)
        : shownText(item);
  }
  return fields;
}

/** The text of an output event: a JSON string, a JSON object's text field, or raw data. */
function outputText(data: string): string {
  const value = parseJson(data);
  if (typeof value === 'string') {
    return value;
  }
  if (isObject(value)) {
    for (const key of ['text', 'data', 'chunk']) {
      if (typeof value[key] === 'string') {
        return value[key] as string;
      }
    }
  }
  return data;
}

/** Decodes one SSE message into a job event; unknown names are kept as `other`. */
export function decodeJobEvent(message: ISseMessage): JobEvent {
  const { event, data, id } = message;
  if (event === 'stdout' || event === 'stderr') {
    return { kind: event, id, text: outputText(data) };
  }
  if (event === 'heartbeat') {
    return { kind: 'heartbeat', id };
  }
  if (event === 'phase') {
    const value = parseJson(data);
    if (isObject(value)) {
      const { phase, ...fields } = value;
      const name = typeof phase === 'string' ? phase : shownText(value.name);
      return { kind: 'phase', id, phase: name, fields: phaseFields(fields) };
    }
    if (typeof value === 'string') {
      return { kind: 'phase', id, phase: value, fields: {} };
    }
    return { kind: 'phase', id, phase: data.trim(), fields: {} };
  }
  return { kind: 'other', id, event, data };
}

/** Whether the event ends the job's stream (the `finished` phase). */
export function isFinished(event: JobEvent): boolean {
  return event.kind === 'phase' && event.phase === 'finished';
}
