/**
 * A job's output as the cell that ran it shows it (and a terminal would): a `\r` returns to
 * the start of the line and what follows overwrites it (a progress bar stays one line, not
 * `progress 5% progress 10% ...`), a `\b` steps back one character, and terminal escape
 * sequences (colours, cursor moves) are dropped rather than shown as `[31m`.
 */

import { element } from './text';

export type Stream = 'stdout' | 'stderr';

interface ISegment {
  stream: Stream;
  text: string;
}

/** A whole escape sequence: CSI (`ESC [ ... final`), OSC (`ESC ] ... BEL` or `ESC \`), or
 * a two-character one (`ESC` and one more, after any intermediates). */
const ESCAPE = /\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[ -/]*[0-~])/g;
/** An escape sequence cut at the end of a chunk: kept until the next chunk completes it. */
const ESCAPE_CUT = /\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*|[ -/]*)$/;
/** The most of a cut escape sequence kept back: past it, the text is no sequence at all
 * (a stray ESC), and holding it would hold back the output after it. */
const MOST_HELD = 256;
/** The pieces of a chunk: text without controls, and each `\n`, `\r` and `\b`. */
const PIECES = /[^\n\r\b]+|[\n\r\b]/g;

/**
 * Writes a job's stdout and stderr into a `pre`: each finished line is appended once, and
 * the line being written sits in one span at the end, redrawn only when a `\r` or `\b`
 * makes text overwrite it (plain output is appended, never redrawn).
 */
export class ConsoleView {
  /** The line being written, as it reads now. */
  private _line: ISegment[] = [];
  private _lineLength = 0;
  /** Where the next character goes in the line (below `_lineLength` after a `\r`). */
  private _column = 0;
  private _lineNode = element('span', 'jp-KCoral-line');
  private _held: Record<Stream, string> = { stdout: '', stderr: '' };

  constructor(readonly node: HTMLElement) {
    node.append(this._lineNode);
  }

  /** Empties the view (another job selected). */
  clear(): void {
    this._line = [];
    this._lineLength = 0;
    this._column = 0;
    this._held = { stdout: '', stderr: '' };
    this._lineNode = element('span', 'jp-KCoral-line');
    this.node.replaceChildren(this._lineNode);
  }

  /** Writes one chunk of a stream. */
  write(stream: Stream, chunk: string): void {
    let text = this._held[stream] + chunk;
    this._held[stream] = '';
    const cut = ESCAPE_CUT.exec(text);
    if (cut && cut[0].length <= MOST_HELD) {
      this._held[stream] = cut[0];
      text = text.slice(0, cut.index);
    }
    text = text.replace(ESCAPE, '').replace(/\x1b/g, '');
    if (this._column === this._lineLength && !/[\r\b]/.test(text)) {
      // The common case, plain output at the line's end: the chunk's whole lines are kept
      // in one node, as before this view (not a node a line: one chunk may hold thousands).
      const end = text.lastIndexOf('\n') + 1;
      if (end > 0) {
        this._endLine(stream, text.slice(0, end));
      }
      if (end < text.length) {
        this._add(stream, text.slice(end));
        this._lineNode.append(segmentNode({ stream, text: text.slice(end) }));
      }
      return;
    }
    let redraw = false;
    for (const [piece] of text.matchAll(PIECES)) {
      if (piece === '\n') {
        if (redraw) {
          this._redraw();
          redraw = false;
        }
        this._endLine(stream, piece);
      } else if (piece === '\r') {
        this._column = 0;
      } else if (piece === '\b') {
        this._column = Math.max(0, this._column - 1);
      } else if (this._column === this._lineLength) {
        this._add(stream, piece);
        if (!redraw) {
          this._lineNode.append(segmentNode({ stream, text: piece }));
        }
      } else {
        this._overwrite(stream, piece);
        redraw = true;
      }
    }
    if (redraw) {
      this._redraw();
    }
  }

  /** The line's nodes drawn again from what it reads now. */
  private _redraw(): void {
    this._lineNode.replaceChildren(...this._line.map(segmentNode));
  }

  /** The line ends with `ending` (a newline, or whole lines ending with one): the nodes
   * that show it are kept for good, and a new line begins. */
  private _endLine(stream: Stream, ending: string): void {
    this._lineNode.before(...this._lineNode.childNodes, segmentNode({ stream, text: ending }));
    this._line = [];
    this._lineLength = 0;
    this._column = 0;
  }

  private _add(stream: Stream, text: string): void {
    const last = this._line[this._line.length - 1];
    if (last && last.stream === stream) {
      last.text += text;
    } else {
      this._line.push({ stream, text });
    }
    this._lineLength += text.length;
    this._column = this._lineLength;
  }

  /** `text` written over the line from the cursor on (past its end where longer). */
  private _overwrite(stream: Stream, text: string): void {
    const start = this._column;
    const end = start + text.length;
    const before: ISegment[] = [];
    const after: ISegment[] = [];
    let at = 0;
    for (const segment of this._line) {
      const from = at;
      at += segment.text.length;
      if (from < start) {
        before.push({ stream: segment.stream, text: segment.text.slice(0, start - from) });
      }
      if (at > end) {
        after.push({ stream: segment.stream, text: segment.text.slice(Math.max(0, end - from)) });
      }
    }
    this._line = [];
    this._lineLength = 0;
    for (const segment of [...before, { stream, text }, ...after]) {
      this._add(segment.stream, segment.text);
    }
    this._column = end;
  }
}

/** stdout as a text node, stderr in its own span (shown in the error colour). */
function segmentNode(segment: ISegment): Node {
  return segment.stream === 'stderr'
    ? element('span', 'jp-KCoral-stderr', segment.text)
    : document.createTextNode(segment.text);
}
