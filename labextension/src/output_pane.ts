/**
 * The KCoral panel's output pane: the selected job's live output, followed through the
 * server extension (resumed at its last event when its stream drops, and taken up again
 * once a server that was away lists the job again), the status it ended with (and why a
 * failed one failed), and Cancel while it is queued or running. The output reads as the
 * cell that ran the job shows it (`console_view.ts`: `\r` overwrites, escapes dropped).
 */

import { IJob } from './api';
import { ConsoleView, Stream } from './console_view';
import {
  describePhase,
  isCancellable,
  jobStateText,
  jobStatusText,
  labelOf,
  serverLabel,
  truncationNote
} from './format';
import { KCoralModel } from './model';
import { followJobEvents, isRetryable } from './stream';
import { element, shownText, unreachedText } from './text';

/** The statuses of a job that ended with an error its result says (PROTOCOL §7.6). */
const FAILED_STATUSES = new Set(['FAILED', 'TIMED_OUT', 'ERROR']);
/** The most of a failed job's error message its `finished` line shows (the tooltip has it). */
const WHY_CHARACTERS = 200;
/** Times a lost live output is taken up again, without any event in between, once its
 * job's server lists the job again. */
const MAX_RESUMES = 3;

export class OutputPane {
  /** The pane: its heading, the job's status and Cancel, the phase line, the output. */
  readonly node = element('div', 'jp-KCoral-output');
  private readonly _outputTitle = element('span', 'jp-KCoral-outputTitle', 'No job selected');
  private readonly _phase = element('div', 'jp-KCoral-phase');
  private readonly _output = element('pre', 'jp-KCoral-outputText');
  private readonly _console = new ConsoleView(this._output);
  private readonly _cancel = element('button', 'jp-KCoral-cancel jp-mod-styled', 'Cancel');
  private _selected: IJob | null = null;
  private _follow: AbortController | null = null;
  /** The status the followed job's event stream finished with ('' before its end). */
  private _finished = '';
  /** The id of the followed job's last event, where a lost live output resumes. */
  private _lastEventId = '';
  /** Why the live output was lost, while it may come back (no answer, a 5xx); null
   * while it is followed, finished, or lost for good. */
  private _lost: string | null = null;
  private _resumes = 0;
  /** Between the followed job's `lease_wait` and `lease_held` phases (SERVER §5). */
  private _leaseWait = false;
  /** The wait before each reconnect of a live output (tests set it shorter). */
  followRetryMs = 1000;
  private _selectionListeners = new Set<() => void>();

  constructor(private readonly _model: KCoralModel) {
    const header = element('div', 'jp-KCoral-outputHeader');
    this._cancel.disabled = true;
    this._cancel.addEventListener('click', () => void this.cancel());
    header.append(this._outputTitle, this._cancel);
    this.node.append(element('h3', '', 'Output'), header, this._phase, this._output);
  }

  /** The selected job's latest record. */
  get selected(): IJob | null {
    return this._selected;
  }

  /** Whether the selected job can be cancelled: its server lists it now, queued or running
   * (a job its server no longer lists has a status nobody knows). */
  get canCancel(): boolean {
    const job = this._selected;
    return job !== null && this._listed(job) && isCancellable(job.status);
  }

  /** Calls `listener` when the selection or its status changes (commands' enabled state). */
  onSelectionChanged(listener: () => void): () => void {
    this._selectionListeners.add(listener);
    return () => this._selectionListeners.delete(listener);
  }

  /** After a poll: the selected job's latest record, its status, a lost output resumed. */
  render(): void {
    if (this._selected) {
      const latest = this._model.job(this._selected.job_id);
      if (latest) {
        this._selected = latest;
      }
    }
    this._renderSelection();
    this._afterLoss();
  }

  /** Selects a job and follows its output from the start. */
  select(job: IJob): void {
    this._selected = job;
    this._finished = '';
    this._console.clear();
    this._phase.textContent = '';
    this._phase.title = '';
    this._lastEventId = '';
    this._resumes = 0;
    this._leaseWait = false;
    this._followFrom(job);
    this._renderSelection();
  }

  /** Follows `job`'s events after `_lastEventId` (all of them for a new selection). */
  private _followFrom(job: IJob): void {
    this._follow?.abort();
    this._lost = null;
    const controller = new AbortController();
    this._follow = controller;
    void followJobEvents({
      signal: controller.signal,
      lastEventId: this._lastEventId,
      retryDelayMs: this.followRetryMs,
      open: (last, signal) => this._model.api.events(job.job_id, last, signal, job.server),
      onEvent: event => {
        if (this._follow !== controller) {
          return;
        }
        this._lastEventId = event.id || this._lastEventId;
        this._resumes = 0;
        if (event.kind === 'stdout' || event.kind === 'stderr') {
          this._append(event.kind, event.text);
        } else if (event.kind === 'phase') {
          if (['lease_wait', 'lease_held', 'finished'].includes(event.phase)) {
            this._leaseWait = event.phase === 'lease_wait';
          }
          // The worker names the instruction it waits in while it waits for the GPU
          // lease: the line said `instruction 0 upload upload_0`, as if that ran, for as
          // long as another program held the GPU.
          if (!(this._leaseWait && event.phase === 'instruction')) {
            this._phase.textContent = describePhase(event.phase, event.fields);
            this._phase.dataset.phase = event.phase;
          }
          if (event.phase === 'finished' && this._follow === controller) {
            this._finished = shownText(event.fields.status);
            if (FAILED_STATUSES.has(this._finished)) {
              void this._showWhy(job, controller);
            }
            const cut = truncationNote(event.fields);
            if (cut) {
              this._keepingTheEndInView(() =>
                this._output.append(element('div', 'jp-KCoral-cut', cut))
              );
            }
            this._renderSelection();
          }
          if (event.phase === 'finished' || event.phase === 'assigned') {
            void this._model.poller.refresh();
          }
        }
      },
      onError: error => {
        if (this._follow !== controller) {
          return;
        }
        const message = unreachedText(error);
        this._phase.textContent = `live output unavailable: ${message}`;
        this._lost = isRetryable(error) ? message : null;
      }
    });
  }

  /** Adds why the followed job failed to its `finished: failed` line (its live output
   * never says it; its result does): `finished: failed · ValueError: boom`. */
  private async _showWhy(job: IJob, controller: AbortController): Promise<void> {
    let why: { kind: string; message: string } | null = null;
    try {
      why = await this._model.api.jobError(job.job_id, job.server);
    } catch {
      return; // the line keeps saying `failed`; the cell that ran it says why
    }
    if (why && why.message && this._follow === controller) {
      const line = why.message.split(/\s+/).join(' ').trim();
      const shown = line.length > WHY_CHARACTERS ? `${line.slice(0, WHY_CHARACTERS)}…` : line;
      this._phase.textContent = `${this._phase.textContent} · ${shown}`;
      this._phase.title = why.kind ? `${why.kind}: ${why.message}` : why.message;
    }
  }

  /**
   * After a poll, a live output lost while its job's server could not be asked: taken up
   * again where it stopped once that server lists the job again (a KCoral or Jupyter
   * server that was away for more than the reconnects); once the server answers again
   * without the job (it restarted), the pane says that, not the `nothing answers` of
   * when it was away.
   */
  private _afterLoss(): void {
    const job = this._selected;
    const servers = this._model.servers;
    if (!job || this._lost === null || servers === null) {
      return; // nothing lost, or this poll failed too: the jobs it has are the last ones read
    }
    const server = servers.find(s => s.name === job.server);
    if (!server) {
      // Only a server that no running kernel uses any more leaves the list.
      this._phase.textContent =
        'live output ended: its server is no longer listed (no running kernel uses it)';
      this._lost = null;
      return;
    }
    const jobsRead = !this._model.jobErrors.some(e => e.server === job.server);
    if (!server.health || !jobsRead) {
      return; // still away
    }
    if (this._listed(job)) {
      if (this._resumes < MAX_RESUMES) {
        this._resumes += 1;
        this._phase.textContent = 'live output: reconnecting';
        this._followFrom(job);
      }
      return;
    }
    this._phase.textContent =
      `live output ended: ${labelOf(server)} answers again but does not list this job ` +
      '(it restarted, or no longer keeps the job)';
    this._lost = null;
  }

  /** Cancels the given job, else the selected one. */
  async cancel(job: IJob | null = this._selected): Promise<void> {
    if (!job) {
      return;
    }
    try {
      await this._model.api.cancel(job.job_id, job.server);
    } catch (error) {
      const message = unreachedText(error);
      this._phase.textContent = `cancel failed: ${message}`;
    }
    await this._model.poller.refresh();
  }

  dispose(): void {
    this._follow?.abort();
    this._selectionListeners.clear();
  }

  private _append(stream: Stream, text: string): void {
    this._keepingTheEndInView(() => this._console.write(stream, text));
  }

  /** Runs `add`, which adds to the output; an output scrolled to its end before (following
   * it) is scrolled to its new end, one scrolled up to read is left where it is. The
   * truncation note went below the end a followed output showed, out of view. */
  private _keepingTheEndInView(add: () => void): void {
    const pinned =
      this._output.scrollTop + this._output.clientHeight >= this._output.scrollHeight - 4;
    add();
    if (pinned) {
      this._output.scrollTop = this._output.scrollHeight;
    }
  }

  /** Whether the jobs table lists `job` now. */
  private _listed(job: IJob): boolean {
    return this._model.job(job.job_id) !== undefined;
  }

  private _renderSelection(): void {
    const job = this._selected;
    if (!job) {
      this._outputTitle.textContent = 'No job selected';
      this._cancel.disabled = true;
    } else {
      const jobId = shownText(job.job_id);
      const where = shownText(serverLabel(this._model.servers, job.server));
      // A job its server stopped listing (the server went away, restarted, or dropped the
      // job) is in no state the panel knows, but the one its stream finished with: not the
      // `running` it last had.
      const listed = this._listed(job);
      const status = listed
        ? jobStateText(job)
        : this._finished
          ? jobStatusText(this._finished)
          : 'status unknown';
      this._outputTitle.textContent = `${status} · job ${jobId.slice(0, 8)}`;
      const gone = listed ? '' : `\n${where || 'its server'} does not list it now`;
      this._outputTitle.title = `job ${jobId}${where ? ` on ${where}` : ''}${gone}`;
      this._outputTitle.dataset.jobId = jobId;
      this._cancel.disabled = !this.canCancel;
    }
    for (const listener of [...this._selectionListeners]) {
      listener();
    }
  }
}
