/**
 * @jest-environment jsdom
 */

/*
 * The output pane's text, as the cell that ran the job shows it. A soak: a progress bar
 * written with `\r` read `progress   0% progress   5% #progress  10% ##...` in the pane
 * (one line in the cell), and a coloured line read `[31mred text[0m`.
 */

import { ConsoleView, Stream } from '../console_view';

function view(...writes: [Stream, string][]): HTMLElement {
  const pre = document.createElement('pre');
  const console = new ConsoleView(pre);
  for (const [stream, text] of writes) {
    console.write(stream, text);
  }
  return pre;
}

const out = (text: string): [Stream, string] => ['stdout', text];
const err = (text: string): [Stream, string] => ['stderr', text];

describe('ConsoleView', () => {
  it('keeps only the last state of a progress bar written with carriage returns', () => {
    const pre = view(
      out('\rprogress   0% '),
      out('\rprogress  50% ##'),
      out('\rprogress 100% ####'),
      out('\ndone\n')
    );
    expect(pre.textContent).toBe('progress 100% ####\ndone\n');
  });

  it('overwrites a line from its start as a terminal does, keeping what a shorter text leaves', () => {
    expect(view(out('abcdef\rXY')).textContent).toBe('XYcdef');
    expect(view(out('abcdef\rXY'), out('Z\n'), out('next')).textContent).toBe('XYZdef\nnext');
  });

  it('reads a carriage return and a newline split across chunks as one line end', () => {
    expect(view(out('first\r'), out('\nsecond\r\n')).textContent).toBe('first\nsecond\n');
  });

  it('steps back one character for a backspace, never before the line', () => {
    expect(view(out('ab\b\bX'), out('\b\b\bY')).textContent).toBe('Yb');
  });

  it('drops colour and cursor escapes, also one cut between two chunks', () => {
    const pre = view(
      out('\x1b[31mred text\x1b[0m and more\n'),
      out('\x1b[1'),
      out(';32mgreen\x1b['),
      out('0m\x1b]0;a title\x07\x1b[2K!\n')
    );
    expect(pre.textContent).toBe('red text and more\ngreen!\n');
    expect(pre.textContent).not.toContain('\x1b');
  });

  it('keeps stderr in its own span where stdout overwrites part of its line', () => {
    const pre = view(err('warning'), out('\rW'));
    expect(pre.textContent).toBe('Warning');
    expect([...pre.querySelectorAll('.jp-KCoral-stderr')].map(s => s.textContent)).toEqual([
      'arning'
    ]);
  });

  it('appends plain output without redrawing what is already shown', () => {
    const pre = document.createElement('pre');
    const console = new ConsoleView(pre);
    console.write('stdout', 'step 1\nstep ');
    const first = pre.firstChild;
    console.write('stdout', '2\n');
    expect(pre.firstChild).toBe(first);
    expect(pre.textContent).toBe('step 1\nstep 2\n');
  });

  it('keeps the whole lines of one chunk in one node, not a node a line', () => {
    const pre = view(out('a\nb\nc\npart'), out('ial'));
    expect([...pre.childNodes].map(node => node.textContent)).toEqual(['a\nb\nc\n', 'partial']);
  });

  it('starts empty again once cleared', () => {
    const pre = document.createElement('pre');
    const console = new ConsoleView(pre);
    console.write('stdout', 'old\x1b[3');
    console.clear();
    console.write('stdout', '1mnew');
    expect(pre.textContent).toBe('1mnew');
  });
});
