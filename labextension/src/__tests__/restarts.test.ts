import { Signal } from '@lumino/signaling';

import { REOPENED, abandonedLine, settleLiveLines, watchForKernelLoss } from '../restarts';

/** A cell's output area as `restarts.ts` reads it: outputs as nbformat JSON. */
class FakeOutputs {
  constructor(public items: Record<string, unknown>[]) {}
  get length(): number {
    return this.items.length;
  }
  get(index: number): { toJSON(): Record<string, unknown> } {
    const item = this.items[index];
    return { toJSON: () => item };
  }
  set(index: number, output: Record<string, unknown>): void {
    this.items[index] = output;
  }
}

const statusLine = (text: string, kcoral: Record<string, unknown>) => ({
  output_type: 'display_data',
  data: { 'text/plain': text, 'text/html': `<div>${text}</div>` },
  metadata: { kcoral }
});

const cell = (...items: Record<string, unknown>[]) => ({ model: { outputs: new FakeOutputs(items) } });

describe('a status line its kernel can no longer update', () => {
  it('is rewritten to say the kernel went away, keeping what it last said', () => {
    const id = 'c84f8fc6-0000-4000-8000-000000000000';
    const running = statusLine('kcoral: running · job c84f8fc6', {
      live: true,
      server: 'x',
      job_id: id
    });
    const done = statusLine('kcoral: COMPLETED · total 5.0 ms', { status: 'COMPLETED' });
    const printed = { output_type: 'stream', name: 'stdout', text: 'tick 1\n' };
    const cells = [cell(printed, running), cell(done), { model: {} }, null];
    expect(settleLiveLines(cells, 'restarted')).toBe(1);
    const [first, second] = cells as { model: { outputs: FakeOutputs } }[];
    expect(first.model.outputs.items[0]).toBe(printed);
    const rewritten = first.model.outputs.items[1] as {
      data: Record<string, string>;
      metadata: { kcoral: Record<string, unknown> };
    };
    expect(rewritten.data['text/plain']).toBe(
      'kcoral: \u26a0 the kernel restarted while this cell ran (last: running); ' +
        `job ${id} may still run on x (%kcoral attach ${id} there)`
    );
    expect(rewritten.metadata.kcoral).toEqual({
      live: false,
      kernel_gone: true,
      server: 'x',
      job_id: id
    });
    expect(second.model.outputs.items[0]).toBe(done);
    expect(settleLiveLines(cells, 'restarted')).toBe(0); // settled once: no longer live
  });

  it('escapes what the line said before it goes into HTML', () => {
    const hostile = statusLine('kcoral: <img src=x onerror=alert(1)>', { live: true });
    const cells = [cell(hostile)];
    settleLiveLines(cells, 'stopped');
    const html = (cells[0].model.outputs.items[0] as { data: Record<string, string> }).data[
      'text/html'
    ];
    expect(html).not.toContain('<img');
    expect(html).toContain('&#60;img');
  });

  it('says only that the kernel went away when the line said nothing and had no job', () => {
    const nowhere = { jobId: null, server: 'http://h:1', localServer: false };
    expect(abandonedLine('kcoral: ', nowhere, 'stopped')).toBe(
      'kcoral: \u26a0 the kernel stopped while this cell ran'
    );
  });

  it('names its job once: the live line\'s own "· job" piece is dropped', () => {
    // a kernel's ticking line, as kcoral_jupyter.job_clock says it
    const id = '3f9c1a2b-0000-4000-8000-000000000000';
    const place = { jobId: id, server: 'http://gpu-box:8000', localServer: false };
    const live = 'kcoral: queued behind 2 \u00b7 5 s \u00b7 job 3f9c1a2b';
    const line = abandonedLine(live, place, 'restarted');
    expect(line).toBe(
      'kcoral: \u26a0 the kernel restarted while this cell ran ' +
        '(last: queued behind 2 \u00b7 5 s); ' +
        `job ${id} may still run on http://gpu-box:8000 (%kcoral attach ${id} there)`
    );
    expect(line.split('3f9c1a2b').length - 1).toBe(2); // the job, and the attach that follows it
  });

  it("says a job on the kernel's own local server ended with it", () => {
    const local = { jobId: 'j', server: 'http://127.0.0.1:5', localServer: true };
    expect(abandonedLine('kcoral: running', local, 'restarted')).toBe(
      "kcoral: \u26a0 the kernel restarted while this cell ran (last: running); its job ended " +
        "with the kernel's local server"
    );
  });

  it('is settled when the notebook kernel restarts, and only for notebooks', async () => {
    const running = statusLine('kcoral: queued behind 2', { live: true });
    const notebook = { content: { widgets: [] as ReturnType<typeof cell>[] } };
    const context = { statusChanged: new Signal<unknown, string>({}), kernelChanged: new Signal({}) };
    const watched = new WeakSet<object>();
    const asContext = context as unknown as Parameters<typeof watchForKernelLoss>[1];
    watchForKernelLoss(notebook, asContext, watched);
    watchForKernelLoss(notebook, asContext, watched); // focused again: watched once
    await Promise.resolve(); // read: nothing was live in it
    notebook.content.widgets.push(cell(running)); // then a cell runs
    context.statusChanged.emit('busy');
    const outputs = notebook.content.widgets[0].model.outputs;
    expect(outputs.items[0]).toBe(running);
    context.statusChanged.emit('restarting');
    expect((outputs.items[0] as { data: Record<string, string> }).data['text/plain']).toMatch(
      /^kcoral: \u26a0 the kernel restarted while this cell ran \(last: queued behind 2\)$/
    );
    const editor = { content: {} }; // a text editor's widget: never watched
    const other = { statusChanged: new Signal<unknown, string>({}), kernelChanged: new Signal({}) };
    watchForKernelLoss(editor, other as unknown as Parameters<typeof watchForKernelLoss>[1], watched);
    expect(watched.has(other)).toBe(false);
  });

  it('is settled as reopened when a notebook opens with it, once the notebook is read', async () => {
    const id = 'c84f8fc6-0000-4000-8000-000000000000';
    const saved = statusLine('kcoral: running · job c84f8fc6', {
      live: true,
      server: 'http://gpu-box:8000',
      job_id: id
    });
    let read = (): void => undefined;
    const ready = new Promise<void>(resolve => (read = resolve));
    const notebook = { content: { widgets: [cell(saved)] }, context: { ready } };
    const context = { statusChanged: new Signal<unknown, string>({}), kernelChanged: new Signal({}) };
    const asContext = context as unknown as Parameters<typeof watchForKernelLoss>[1];
    watchForKernelLoss(notebook, asContext, new WeakSet<object>());
    const outputs = notebook.content.widgets[0].model.outputs;
    expect(outputs.items[0]).toBe(saved); // not read yet
    read();
    await ready;
    await Promise.resolve();
    const settled = outputs.items[0] as {
      data: Record<string, string>;
      metadata: { kcoral: Record<string, unknown> };
    };
    expect(settled.data['text/plain']).toBe(
      'kcoral: \u26a0 the notebook was reopened while this cell ran (last: running); ' +
        `job ${id} may still run on http://gpu-box:8000 (%kcoral attach ${id} there)`
    );
    expect(settled.metadata.kcoral).toMatchObject({ live: false, kernel_gone: false });
  });

  it("does not say a reopened line's job ended with the kernel's local server", () => {
    const local = { jobId: 'j', server: 'http://127.0.0.1:5', localServer: true };
    expect(abandonedLine('kcoral: running', local, REOPENED)).toBe(
      'kcoral: \u26a0 the notebook was reopened while this cell ran (last: running); job j may ' +
        'still run on http://127.0.0.1:5 (%kcoral attach j there)'
    );
  });
});
