/**
 * The KCoral side panel: configured servers with health, target, versions, features and
 * session seats; the sessions (EXTENSIONS §11) with a Stop button each; the jobs table
 * (newest first, refreshed by the model's poller); the selected job's live output, with
 * Cancel for queued and running jobs (`output_pane`).
 */

import { Widget } from '@lumino/widgets';

import { IJob, ISession, IServerEntry, IServerError } from './api';
import {
  FLEET_COLUMNS,
  fleetRows,
  JOB_COLUMNS,
  jobCells,
  jobStatusClass,
  jobTitle,
  labelOf,
  loadText,
  NO_WORKER_READY,
  sandboxText,
  serverLabel,
  sessionSeatsText,
  sessionView,
  targetOf,
  unreachedSentence
} from './format';
import { KCoralModel } from './model';
import { OutputPane } from './output_pane';
import { element, shownText, unreachedText } from './text';

/**
 * Builds one part of the panel (a row, a card, a section); if that throws (a value from a
 * server the panel cannot show), logs why and builds `fallback` instead, so one bad record
 * never stops the rest of the rendering.
 */
function guarded<T>(what: string, build: () => T, fallback: () => T): T {
  try {
    return build();
  } catch (error) {
    console.error(`KCoral: the panel cannot show ${what}`, error);
    return fallback();
  }
}

/** A line of a note about one server (`label: message`, the message alone without one). */
function serverNote(servers: IServerEntry[] | null, error: IServerError): string {
  const label = serverLabel(servers, error.server);
  return label ? `${label}: ${error.message}` : error.message;
}

/** A fleet cell; one of parts (`1/2 ready · 1 draining`) has a line per part, so the
 * nodes column of a narrow panel stays as wide as its longest part. */
function fleetCell(text: string): HTMLElement {
  const parts = text.split(' · ');
  if (parts.length === 1) {
    return element('td', '', text);
  }
  const cell = element('td', 'jp-KCoral-fleetParts');
  parts.forEach((part, index) => cell.append(element('span', '', index ? ` · ${part}` : part)));
  return cell;
}

/** A router's fleet (ROUTER §6): kinds and labels with nodes, free seats, queue, wait. */
function fleetTable(server: IServerEntry): HTMLElement | null {
  const rows = fleetRows(server.info);
  if (rows.length === 0) {
    return null;
  }
  const table = element('table', 'jp-KCoral-fleet');
  const head = element('tr');
  for (const column of FLEET_COLUMNS) {
    const cell = element('th', '', column.name);
    cell.title = column.title;
    head.append(cell);
  }
  table.append(element('thead'), element('tbody'));
  table.tHead!.append(head);
  for (const row of rows) {
    const line = element('tr', row.isDefault ? 'jp-KCoral-fleetDefault' : '');
    line.title = row.title;
    for (const text of row.cells) {
      line.append(fleetCell(text));
    }
    table.tBodies[0].append(line);
  }
  return table;
}

/** Ended sessions stay listed for the server's retention time; the panel shows this many. */
const ENDED_SESSIONS_SHOWN = 3;
/** How long the result of a Stop click stays on screen. */
const STOP_NOTE_MS = 8000;
/** What a list says while the server extension cannot be asked: its rows are the last read. */
const STALE_NOTE = 'As last listed: not updated while the server extension cannot be asked.';

export class KCoralPanel extends Widget {
  private readonly _servers = element('div', 'jp-KCoral-servers');
  private readonly _sessions = element('div', 'jp-KCoral-sessions');
  private readonly _sessionList = element('div', 'jp-KCoral-sessionList');
  private readonly _sessionNote = element('div', 'jp-KCoral-note jp-KCoral-sessionNote');
  /** Sessions whose Stop is in flight: their button stays disabled across re-renders. */
  private readonly _stopping = new Set<string>();
  private _stopNoteTimer: ReturnType<typeof setTimeout> | undefined;
  private readonly _jobsBody = element('tbody');
  private readonly _jobsNote = element('div', 'jp-KCoral-note');
  private readonly _pane: OutputPane;
  private readonly _unsubscribe: () => void;

  constructor(private readonly _model: KCoralModel) {
    super();
    this.id = 'kcoral-panel';
    this.addClass('jp-KCoral-panel');
    this.title.caption = 'KCoral';

    const header = element('div', 'jp-KCoral-header');
    const refresh = element('button', 'jp-KCoral-refresh jp-mod-styled', 'Refresh');
    refresh.addEventListener('click', () => void this._model.poller.refresh());
    header.append(element('h2', '', 'KCoral'), refresh);

    const jobs = element('div', 'jp-KCoral-jobs');
    const table = element('table', 'jp-KCoral-jobTable');
    const head = element('tr');
    for (const column of JOB_COLUMNS) {
      const cell = element('th', '', column.name);
      cell.title = column.title;
      head.append(cell);
    }
    table.append(element('thead'), this._jobsBody);
    table.tHead!.append(head);
    const scroller = element('div', 'jp-KCoral-tableScroller');
    scroller.append(table);
    jobs.append(element('h3', '', 'Jobs'), this._jobsNote, scroller);

    this._pane = new OutputPane(_model);

    this._sessions.append(element('h3', '', 'Sessions'), this._sessionNote, this._sessionList);

    this.node.append(
      header,
      element('h3', '', 'Servers'),
      this._servers,
      this._sessions,
      jobs,
      this._pane.node
    );
    this._unsubscribe = _model.subscribe(() => this.render());
    this.render();
  }

  render(): void {
    const nothing = (): void => undefined;
    guarded('the servers', () => this._renderServers(this._model.servers), nothing);
    guarded('the sessions', () => this._renderSessions(this._model.sessions), nothing);
    guarded('the jobs', () => this._renderJobs(this._model.jobs), nothing);
    this._pane.render();
  }

  /** The selected job's latest record. */
  get selected(): IJob | null {
    return this._pane.selected;
  }

  /** Whether the selected job can be cancelled (queued or running, listed now). */
  get canCancelSelected(): boolean {
    return this._pane.canCancel;
  }

  /** Calls `listener` when the selection or its status changes (commands' enabled state). */
  onSelectionChanged(listener: () => void): () => void {
    return this._pane.onSelectionChanged(listener);
  }

  /** The wait before each reconnect of a live output (tests set it shorter). */
  get followRetryMs(): number {
    return this._pane.followRetryMs;
  }

  set followRetryMs(ms: number) {
    this._pane.followRetryMs = ms;
  }

  /** Selects a job and follows its output from the start. */
  select(job: IJob): void {
    this._pane.select(job);
    this._renderJobs(this._model.jobs);
  }

  /** Cancels the given job, else the selected one. */
  cancel(job: IJob | null = this._pane.selected): Promise<void> {
    return this._pane.cancel(job);
  }

  cancelSelected(): Promise<void> {
    return this._pane.cancel();
  }

  /** Ends a session (its running program is stopped, its worker retires, EXTENSIONS §11). */
  async stopSession(session: ISession): Promise<void> {
    const shortId = session.session_id.slice(0, 8);
    this._stopping.add(session.session_id);
    this._renderSessions(this._model.sessions);
    try {
      const record = await this._model.api.stopSession(session.session_id, session.server);
      const how = record?.state === 'ENDED' ? 'ended' : `is ${record?.state || 'unknown'}`;
      this._showStopNote(`session ${shortId} ${how}`, false);
    } catch (error) {
      const message = unreachedText(error);
      this._showStopNote(`stop ${shortId} failed: ${message}`, true);
    } finally {
      this._stopping.delete(session.session_id);
    }
    await this._model.poller.refresh();
  }

  dispose(): void {
    clearTimeout(this._stopNoteTimer);
    this._pane.dispose();
    this._unsubscribe();
    super.dispose();
  }

  private _renderServers(servers: IServerEntry[] | null): void {
    this._servers.replaceChildren();
    if (servers === null) {
      this._servers.append(
        element('div', 'jp-KCoral-note', unreachedSentence(this._model.unreached))
      );
      return;
    }
    if (servers.length === 0) {
      this._servers.append(
        element(
          'div',
          'jp-KCoral-note',
          // What a fresh install shows before its first cell: nothing needs configuring.
          "No KCoral server yet: a notebook's first %%kcoral cell starts one for its " +
            'kernel (or set KCORAL_URL, or c.KCoralExtension.servers).'
        )
      );
      return;
    }
    for (const server of servers) {
      const card = guarded(
        `the server ${server.name}`,
        () => this._serverCard(server),
        () => {
          const bad = element('div', 'jp-KCoral-server');
          bad.dataset.server = shownText(server.name);
          bad.append(
            element('div', 'jp-KCoral-serverTitle', shownText(server.name)),
            element(
              'div',
              'jp-KCoral-note jp-KCoral-serverError',
              'The panel cannot show what this server sent (the browser console says why).'
            )
          );
          return bad;
        }
      );
      this._servers.append(card);
    }
  }

  /** One server's card: title, URL, facts, fleet table, error. */
  private _serverCard(server: IServerEntry): HTMLElement {
    const card = element('div', 'jp-KCoral-server');
    card.dataset.server = server.name;
    // Up but refusing this Jupyter server's token (or its /v1/info unusable): not the
    // green of a server that takes cells.
    card.dataset.state = server.health ? (server.error ? 'refused' : 'online') : 'offline';
    if (server.health?.load.request_capacity === 0) {
      card.dataset.ready = 'none'; // an amber dot, and the load says why
      card.title = NO_WORKER_READY;
    }
    const title = element('div', 'jp-KCoral-serverTitle');
    title.title = `${server.url} (${server.name})`;
    title.append(
      element('span', 'jp-KCoral-dot', '●'),
      element('span', 'jp-KCoral-serverName', ` ${labelOf(server)}`)
    );
    card.append(title);
    // The URL on its own line: a long one wraps instead of widening the panel.
    if (labelOf(server) !== server.url.replace(/^http:\/\//, '')) {
      card.append(element('div', 'jp-KCoral-serverUrl', server.url));
    }
    const notebooks = Array.isArray(server.notebooks) ? server.notebooks : [];
    if (server.health) {
      const load = server.health.load;
      const seats = sessionSeatsText(server.info);
      const facts: [string, string][] = [
        ['health', server.health.status || '–'],
        ['target', targetOf(server)],
        [
          'load',
          loadText(load.requests_in_progress, load.request_capacity, load.requests_waiting)
        ],
        ['sandbox', sandboxText(server.info?.sandbox) || '–'],
        ...(seats ? [['sessions', seats] as [string, string]] : []),
        ['kcoral', server.info?.kcoral || '–'],
        [
          'versions',
          Object.entries(server.health.versions ?? {})
            .map(([k, v]) => `${k} ${v}`)
            .join(', ') || '–'
        ],
        ['features', server.features.length ? server.features.join(', ') : '–'],
        ...(notebooks.length ? [['used by', notebooks.join(', ')] as [string, string]] : [])
      ];
      const list = element('dl', 'jp-KCoral-facts');
      for (const [key, value] of facts) {
        list.append(element('dt', '', key), element('dd', '', value));
      }
      card.append(list);
      const fleet = fleetTable(server);
      if (fleet) {
        card.append(fleet);
      }
      if (server.error) {
        // Up, but refusing this Jupyter server's token: every cell would be refused too.
        card.append(element('div', 'jp-KCoral-note jp-KCoral-serverError', server.error));
      }
    } else {
      card.append(
        element('div', 'jp-KCoral-note jp-KCoral-serverError', server.error || 'unreachable')
      );
    }
    return card;
  }

  private _showStopNote(text: string, failed: boolean): void {
    clearTimeout(this._stopNoteTimer);
    this._sessionNote.textContent = text;
    this._sessionNote.classList.toggle('jp-KCoral-error', failed);
    this._stopNoteTimer = setTimeout(() => {
      this._stopNoteTimer = undefined;
      this._renderSessions(this._model.sessions);
    }, STOP_NOTE_MS);
    this._renderSessions(this._model.sessions);
  }

  private _renderSessions(sessions: ISession[]): void {
    const live = sessions.filter(s => s.state !== 'ENDED');
    const ended = sessions.filter(s => s.state === 'ENDED');
    const shown = [...live, ...ended.slice(0, ENDED_SESSIONS_SHOWN)];
    const servers = this._model.servers;
    const notes = this._model.sessionErrors.map(e => serverNote(servers, e));
    if (servers === null && shown.length) {
      notes.unshift(STALE_NOTE);
    }
    if (this._stopNoteTimer === undefined) {
      this._sessionNote.textContent = notes.join('; ');
      this._sessionNote.classList.remove('jp-KCoral-error');
    }
    // Nothing to say when no server has a session: the server cards show the free seats.
    this._sessions.hidden = shown.length === 0 && !this._sessionNote.textContent;
    const now = Date.now() / 1000;
    // Name the server on each card only when the list mixes servers (the tooltip always has it).
    const mixed = new Set(shown.map(s => s.server)).size > 1;
    this._sessionList.replaceChildren();
    for (const session of shown) {
      const card = guarded(
        `the session ${session.session_id}`,
        () => this._sessionCard(session, now, mixed),
        () => {
          const bad = element('div', 'jp-KCoral-session');
          bad.dataset.sessionId = shownText(session.session_id);
          bad.append(
            element(
              'div',
              'jp-KCoral-sessionState',
              `session ${shownText(session.session_id).slice(0, 8)}: the panel cannot show ` +
                'this record (the browser console says why)'
            )
          );
          return bad;
        }
      );
      this._sessionList.append(card);
    }
    const hidden = ended.length - (shown.length - live.length);
    if (hidden > 0) {
      this._sessionList.append(
        element(
          'div',
          'jp-KCoral-note',
          `${hidden} older ended session${hidden === 1 ? '' : 's'} not shown`
        )
      );
    }
  }

  /** One session's card, with Stop while it lives; `mixed`: the list mixes servers. */
  private _sessionCard(session: ISession, now: number, mixed: boolean): HTMLElement {
    const servers = this._model.servers;
    const view = sessionView(session, now, serverLabel(servers, session.server));
    const card = element('div', 'jp-KCoral-session');
    card.dataset.sessionId = session.session_id;
    card.dataset.state = session.state;
    card.title = view.title;
    const line = element('div', 'jp-KCoral-sessionLine');
    line.append(
      element('span', 'jp-KCoral-sessionId', view.shortId),
      element('span', 'jp-KCoral-sessionOwner', view.owner),
      element('span', 'jp-KCoral-sessionGpu', view.gpu)
    );
    if (mixed && session.server) {
      line.append(
        element('span', 'jp-KCoral-sessionServer', `on ${serverLabel(servers, session.server)}`)
      );
    }
    if (view.live) {
      // An ended session's worker is gone: no memory to speak of.
      const memory = element('span', 'jp-KCoral-sessionMemory', view.memory);
      memory.title = "Resident memory of the session's worker process";
      line.append(memory);
    }
    const state = element('div', 'jp-KCoral-sessionState', view.state);
    const body = element('div', 'jp-KCoral-sessionBody');
    body.append(line, state);
    card.append(body);
    if (view.live) {
      const stopping = this._stopping.has(session.session_id);
      const stop = element(
        'button',
        'jp-KCoral-stopSession jp-mod-styled',
        stopping ? 'Stopping…' : 'Stop'
      );
      stop.title = `End session ${session.session_id}: its state is lost, its seat freed`;
      stop.disabled = stopping;
      stop.addEventListener('click', () => void this.stopSession(session));
      card.append(stop);
    }
    return card;
  }

  private _renderJobs(jobs: IJob[]): void {
    this._jobsBody.replaceChildren();
    const servers = this._model.servers;
    const notes = this._model.jobErrors
      .filter(e => !/no jobs API/.test(e.message))
      .map(e => serverNote(servers, e));
    // "yet" only when every server answered: one that did not may well have jobs. While
    // the server extension cannot be asked, the rows are those it listed last.
    const away = servers === null;
    const none = notes.length || servers === null ? 'No jobs listed.' : 'No jobs yet.';
    this._jobsNote.textContent = jobs.length === 0 ? none : away ? STALE_NOTE : '';
    if (notes.length) {
      this._jobsNote.textContent += ` ${notes.join('; ')}`;
    }
    // Jobs of several servers: one block per server under a row that names it (in the
    // order the servers' newest jobs come), newest first within each.
    const byServer = new Map<string, IJob[]>();
    for (const job of jobs) {
      const key = job.server ?? '';
      byServer.set(key, [...(byServer.get(key) ?? []), job]);
    }
    // Also when one server of several has jobs: with two notebooks on two local servers,
    // an unnamed job read as the focused notebook's.
    const mixed = byServer.size > 1 || (servers?.length ?? 0) > 1;
    for (const [server, serverJobs] of byServer) {
      if (mixed) {
        const heading = element('tr', 'jp-KCoral-jobServer');
        heading.dataset.server = server;
        const cell = element('th', '', serverLabel(servers, server) || 'unknown server');
        cell.colSpan = JOB_COLUMNS.length;
        heading.append(cell);
        this._jobsBody.append(heading);
      }
      this._renderJobRows(serverJobs);
    }
  }

  private _renderJobRows(jobs: IJob[]): void {
    for (const job of jobs) {
      const row = guarded(
        `the job ${job.job_id}`,
        () => this._jobRow(job),
        () => {
          const bad = element('tr', 'jp-KCoral-job');
          bad.dataset.jobId = shownText(job.job_id);
          const cell = element(
            'td',
            '',
            `job ${shownText(job.job_id).slice(0, 8)}: the panel cannot show this record ` +
              '(the browser console says why)'
          );
          cell.colSpan = JOB_COLUMNS.length;
          bad.append(cell);
          return bad;
        }
      );
      this._jobsBody.append(row);
    }
  }

  /** One job's row; a click selects the job. */
  private _jobRow(job: IJob): HTMLElement {
    const row = element('tr', 'jp-KCoral-job');
    row.dataset.jobId = job.job_id;
    row.dataset.status = shownText(job.status);
    row.title = jobTitle(job, serverLabel(this._model.servers, job.server));
    if (this._pane.selected?.job_id === job.job_id) {
      row.classList.add('jp-mod-selected');
    }
    jobCells(job).forEach((text, index) => {
      const cell = element('td', index === 0 ? jobStatusClass(job.status) : '', text);
      if (index === 2) {
        cell.title = `worker ${text}\n${row.title}`; // the column that may be cut off
      }
      row.append(cell);
    });
    row.addEventListener('click', () => this.select(job));
    return row;
  }

}
