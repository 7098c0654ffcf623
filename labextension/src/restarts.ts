/**
 * A `%%kcoral` cell updates its status line in place while it runs (`kcoral: running · job
 * c84f8fc6 …`, its metadata saying `kcoral.live`). When the kernel restarts or dies under
 * it, nothing will update that line again: it would say `running` for good, in the saved
 * notebook too. So when a notebook's kernel restarts, dies or is replaced, each such line
 * is rewritten to say what is known: the kernel went away while the cell ran, what the
 * line said last, and, for a cell that had submitted its job, where that job is: ended with
 * the kernel's own local server, or maybe still running on its server, where `%kcoral
 * attach` finds it. A notebook opened (or the page reloaded) with such a line in it is the
 * same: the kernel's updates go to the view that ran the cell, never to a new one, so the
 * line is settled once the notebook is read (`reopened`).
 *
 * Notebooks are reached through the shell's widgets, read by shape (`content.widgets`,
 * each cell's `model.outputs`) rather than through `@jupyterlab/notebook`, which this
 * extension does not otherwise need.
 */

import { ISessionContext } from '@jupyterlab/apputils';

/** What is read of one output of a cell's output area. */
interface IOutputLike {
  toJSON(): { output_type?: unknown; data?: unknown; metadata?: unknown };
}

/** What is read and written of a cell's output area model. */
interface IOutputsLike {
  readonly length: number;
  get(index: number): IOutputLike;
  set(index: number, output: Record<string, unknown>): void;
}

/** The kernel statuses that end a cell's updates, and how the line says it. */
const ENDED_BY: Record<string, string> = {
  restarting: 'restarted',
  autorestarting: 'restarted',
  dead: 'stopped'
};

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`);
}

/** Where a live line's job is, as its metadata (`job_id`, `server`, `local_server`) says. */
export interface IJobPlace {
  jobId: string | null;
  server: string | null;
  localServer: boolean;
}

/** `how` for a line found live in a notebook as it opens: its kernel may still run. */
export const REOPENED = 'reopened';

/** The line a live status line becomes once its kernel `how` (restarted, stopped,
 * changed), or the notebook was `REOPENED`: what it last said, and where its job is. */
export function abandonedLine(lastText: string, place: IJobPlace, how: string): string {
  let last = lastText.replace(/^kcoral:\s*/, '').trim();
  const subject = how === REOPENED ? 'the notebook was reopened' : `the kernel ${how}`;
  let job = '';
  if (place.localServer && how !== REOPENED) {
    job = "; its job ended with the kernel's local server";
  } else if (place.jobId) {
    const where = place.server ? ` on ${place.server}` : '';
    job = `; job ${place.jobId} may still run${where} (%kcoral attach ${place.jobId} there)`;
    // The live line's own "· job c84f8fc6" named the job a second time in one line.
    last = last.split(` \u00b7 job ${place.jobId.slice(0, 8)}`).join('');
  }
  const said = last ? ` (last: ${last})` : '';
  return `kcoral: \u26a0 ${subject} while this cell ran${said}${job}`;
}

/** The output that replaces a live status line `output`, or null when it is not one. */
export function abandonedOutput(
  output: IOutputLike,
  how: string
): Record<string, unknown> | null {
  const json = output.toJSON();
  const metadata = isRecord(json.metadata) ? json.metadata : {};
  const kcoral = metadata.kcoral;
  if (!isRecord(kcoral) || kcoral.live !== true || !isRecord(json.data)) {
    return null;
  }
  const plain = json.data['text/plain'];
  const text = abandonedLine(
    typeof plain === 'string' ? plain : Array.isArray(plain) ? plain.join('') : '',
    {
      jobId: typeof kcoral.job_id === 'string' ? kcoral.job_id : null,
      server: typeof kcoral.server === 'string' ? kcoral.server : null,
      localServer: kcoral.local_server === true
    },
    how
  );
  return {
    output_type: 'display_data',
    data: {
      'text/plain': text,
      'text/html':
        '<div class="kcoral-line" style="font-family:var(--jp-code-font-family,monospace);' +
        `font-size:12px;color:#9a6700;font-weight:600">${escapeHtml(text)}</div>`
    },
    metadata: { ...metadata, kcoral: { ...kcoral, live: false, kernel_gone: how !== REOPENED } }
  };
}

/** Rewrites the live status lines of `cells` (a notebook's cell widgets) for a kernel
 * that `how` (restarted, stopped, changed); how many. */
export function settleLiveLines(cells: readonly unknown[], how: string): number {
  let rewritten = 0;
  for (const cell of cells) {
    const outputs = (cell as { model?: { outputs?: unknown } } | null)?.model?.outputs;
    if (!outputs || typeof (outputs as IOutputsLike).get !== 'function') {
      continue;
    }
    const area = outputs as IOutputsLike;
    for (let index = 0; index < area.length; index++) {
      const replacement = abandonedOutput(area.get(index), how);
      if (replacement) {
        area.set(index, replacement);
        rewritten++;
      }
    }
  }
  return rewritten;
}

/** The cell widgets of a notebook panel, or null for any other widget. */
function cellsOf(widget: unknown): readonly unknown[] | null {
  const cells = (widget as { content?: { widgets?: unknown } } | null)?.content?.widgets;
  return Array.isArray(cells) ? cells : null;
}

/** A notebook panel's model is read: its `context.ready` (a stand-in without one: now). */
function whenRead(widget: unknown): Promise<unknown> {
  const ready = (widget as { context?: { ready?: Promise<unknown> } } | null)?.context?.ready;
  return ready ?? Promise.resolve();
}

/**
 * Watches `widget` (a notebook panel; anything else is left alone) once: the live status
 * lines it opens with are settled as `REOPENED` (no cell of this view has run yet: the
 * first view of a notebook is watched as it opens), and when its kernel restarts, dies or
 * is replaced, those of its cells then running are settled.
 */
export function watchForKernelLoss(
  widget: unknown,
  context: ISessionContext | null,
  watched: WeakSet<object>
): void {
  if (context === null || cellsOf(widget) === null || watched.has(context)) {
    return;
  }
  watched.add(context);
  const settle = (how: string): void => {
    const cells = cellsOf(widget);
    if (cells) {
      settleLiveLines(cells, how);
    }
  };
  context.statusChanged.connect((_, status) => {
    if (Object.prototype.hasOwnProperty.call(ENDED_BY, status)) {
      settle(ENDED_BY[status]);
    }
  });
  context.kernelChanged.connect(() => settle('changed'));
  void whenRead(widget).then(() => settle(REOPENED));
}
