/**
 * @jest-environment jsdom
 */

/*
 * The panel fed by a broken or rogue KCoral server: records of the wrong types come
 * through the real client (api.ts) and model into the real panel, rendered in jsdom. One
 * bad record must not stop the rendering of the others, and what the panel shows of it
 * must be true. jsdom has no fetch Response: the fake answers are minimal objects.
 */

import './jsdom'; // before the panel: Lumino reads DragEvent when it loads

import { IJob, KCoralApi } from '../api';
import { KCoralModel } from '../model';
import { KCoralPanel } from '../panel';

/** JSON whose own `toString` is no function: `String()` and template literals throw on it. */
const POISON_JSON = '{"toString":1,"valueOf":1}';
const POISON = { toString: 1, valueOf: 1 };

function answer(body: unknown, status = 200): Response {
  const text = JSON.stringify(body);
  return {
    ok: status < 300,
    status,
    text: async () => text,
    json: async () => JSON.parse(text)
  } as unknown as Response;
}

function healthyServer(name: string, info: Record<string, unknown> = {}) {
  return {
    name,
    url: `http://${name}:8000`,
    auth: false,
    reachable: true,
    features: ['jobs', 'sessions'],
    kernels: [],
    health: {
      status: 'ok',
      load: { request_capacity: 2, requests_in_progress: 1, requests_waiting: 0 },
      target: {},
      versions: { python: '3.12' }
    },
    info: { kcoral: '0.1.0', protocol: 1, features: [], device: 'cpu', ...info }
  };
}

function job(id: string, minute: number, over: Record<string, unknown> = {}) {
  return {
    job_id: id,
    request_id: `r-${id}`,
    status: 'RUNNING',
    submitted_at: `2026-12-01T12:${String(minute).padStart(2, '0')}:00Z`,
    worker_id: 'cpu/w0',
    gpu_ids: [],
    elapsed_ms: 5,
    queue_ms: 0,
    server: 'a',
    ...over
  };
}

function session(id: string, over: Record<string, unknown> = {}) {
  return {
    session_id: id,
    owner: 'alice',
    state: 'RUNNING',
    gpu_ids: [],
    created_at: 1_000,
    server: 'a',
    observed_at: 1_100,
    ...over
  };
}

interface IAnswers {
  servers?: unknown[];
  jobs?: unknown[];
  sessions?: unknown[];
}

const opened: { panel: KCoralPanel; model: KCoralModel }[] = [];

/** A panel over a model whose one poll got `answers` from the server extension. */
async function panelAfterPoll(answers: IAnswers): Promise<KCoralPanel> {
  const fetcher = async (path: string): Promise<Response> => {
    if (path === 'servers') {
      return answer({ servers: answers.servers ?? [healthyServer('a')] });
    }
    if (path === 'jobs') {
      return answer({ jobs: answers.jobs ?? [], errors: [] });
    }
    if (path === 'sessions') {
      return answer({ sessions: answers.sessions ?? [], errors: [] });
    }
    return answer({ error: { kind: 'job_expired', message: 'gone' } }, 404);
  };
  const model = new KCoralModel(new KCoralApi(fetcher), {
    pollIntervalMs: 60_000,
    statusServer: ''
  });
  const panel = new KCoralPanel(model);
  opened.push({ panel, model });
  await model.poll().catch(() => undefined);
  return panel;
}

/** A panel whose model holds `jobs` as they are (no check at the boundary). */
function panelWithJobs(jobs: IJob[]): KCoralPanel {
  const model = new KCoralModel(new KCoralApi(async () => answer({})), {
    pollIntervalMs: 60_000,
    statusServer: ''
  });
  model.servers = [];
  model.jobs = jobs;
  const panel = new KCoralPanel(model);
  opened.push({ panel, model });
  return panel;
}

function jobRows(panel: KCoralPanel): { id: string; cells: string[]; classes: string[] }[] {
  return [...panel.node.querySelectorAll<HTMLTableRowElement>('tr.jp-KCoral-job')].map(row => ({
    id: row.dataset.jobId ?? '',
    cells: [...row.cells].map(cell => cell.textContent ?? ''),
    classes: [...row.cells].map(cell => cell.className)
  }));
}

function sessionCards(panel: KCoralPanel): { id: string; state: string }[] {
  return [...panel.node.querySelectorAll<HTMLElement>('.jp-KCoral-session')].map(card => ({
    id: card.dataset.sessionId ?? '',
    state: card.querySelector('.jp-KCoral-sessionState')?.textContent ?? ''
  }));
}

function text(panel: KCoralPanel, selector: string): string {
  return panel.node.querySelector(selector)?.textContent ?? '';
}

let errors: jest.SpyInstance;

beforeEach(() => {
  errors = jest.spyOn(console, 'error').mockImplementation(() => undefined);
});

afterEach(() => {
  for (const { panel, model } of opened.splice(0)) {
    panel.dispose();
    model.dispose();
  }
  errors.mockRestore();
});

describe('the panel fed malformed jobs by a rogue server', () => {
  it('shows a job whose gpu_ids is no list without GPUs, and every other job', async () => {
    const panel = await panelAfterPoll({
      jobs: [job('ok-1', 3, { gpu_ids: [0] }), job('evil', 2, { gpu_ids: 'x' }), job('ok-2', 1)]
    });
    expect(jobRows(panel).map(r => [r.id, r.cells[2]])).toEqual([
      ['ok-1', 'cpu/w0 · GPU 0'],
      ['evil', 'cpu/w0'],
      ['ok-2', 'cpu/w0']
    ]);
  });

  it('leaves out a job without a string job id, says so, and still follows a selection', async () => {
    const panel = await panelAfterPoll({
      jobs: [job('ok-1', 3), { ...job('x', 2), job_id: 12345 }, job('ok-2', 1)]
    });
    expect(jobRows(panel).map(r => r.id)).toEqual(['ok-1', 'ok-2']);
    expect(text(panel, '.jp-KCoral-jobs .jp-KCoral-note')).toContain(
      'a: 1 job record without a job id is not shown'
    );
    panel.node.querySelectorAll<HTMLElement>('tr.jp-KCoral-job')[1].click();
    expect(text(panel, '.jp-KCoral-outputTitle')).toBe('running · job ok-2');
    expect(panel.selected?.job_id).toBe('ok-2');
  });

  it('says a status or submission time it cannot read is unknown, in that row only', async () => {
    const panel = await panelAfterPoll({
      jobs: [
        job('ok-1', 4),
        job('bad-status', 3, { status: POISON }),
        job('bad-time', 2, { submitted_at: POISON }),
        job('ok-2', 1, { status: 'COMPLETED' })
      ]
    });
    const rows = jobRows(panel);
    // The job without a readable time sorts last, as jobs without a time do.
    expect(rows.map(r => [r.id, r.cells[0], r.cells[1]])).toEqual([
      ['ok-1', 'running', expect.stringMatching(/^\d\d:\d\d:\d\d$/)],
      ['bad-status', '–', expect.stringMatching(/^\d\d:\d\d:\d\d$/)],
      ['ok-2', 'done', expect.stringMatching(/^\d\d:\d\d:\d\d$/)],
      ['bad-time', 'running', '–']
    ]);
    panel.node.querySelectorAll<HTMLElement>('tr.jp-KCoral-job')[1].click();
    expect(text(panel, '.jp-KCoral-outputTitle')).toBe('– · job bad-stat');
  });

  it('gives class names only to the statuses the protocol defines', async () => {
    const panel = await panelAfterPoll({
      jobs: [job('known', 2, { status: 'FAILED' }), job('odd', 1, { status: 'RUNNING x-evil' })]
    });
    expect(jobRows(panel).map(r => [r.cells[0], r.classes[0]])).toEqual([
      ['failed', 'jp-KCoral-status-FAILED'],
      ['running x-evil', '']
    ]);
  });

  it('shows the other rows when building one row fails, and says which row failed', () => {
    const broken = { ...job('broken', 2) } as unknown as IJob;
    Object.defineProperty(broken, 'elapsed_ms', {
      get() {
        throw new Error('a field that cannot be read');
      }
    });
    const panel = panelWithJobs([
      job('ok-1', 3) as unknown as IJob,
      broken,
      job('ok-2', 1) as unknown as IJob
    ]);
    const rows = jobRows(panel);
    expect(rows.map(r => r.id)).toEqual(['ok-1', 'broken', 'ok-2']);
    expect(rows[1].cells).toEqual([
      'job broken: the panel cannot show this record (the browser console says why)'
    ]);
    expect(rows[2].cells[0]).toBe('running');
    expect(errors).toHaveBeenCalledWith(
      'KCoral: the panel cannot show the job broken',
      expect.any(Error)
    );
  });

  it('renders jobs whose fields were never checked without throwing', () => {
    const raw = [
      job('ok-1', 3),
      { ...job('raw', 2), status: POISON, submitted_at: POISON, gpu_ids: 'x', worker_id: POISON },
      job('ok-2', 1)
    ] as unknown as IJob[];
    const panel = panelWithJobs(raw);
    expect(jobRows(panel).map(r => [r.id, ...r.cells.slice(0, 3)])).toEqual([
      ['ok-1', 'running', expect.any(String), 'cpu/w0'],
      ['raw', POISON_JSON.toLowerCase(), '–', POISON_JSON],
      ['ok-2', 'running', expect.any(String), 'cpu/w0']
    ]);
    expect(errors).not.toHaveBeenCalled();
  });
});

describe('the panel fed malformed sessions and fleets by a rogue server', () => {
  it('says a session state it cannot read is unknown and shows the other sessions', async () => {
    const panel = await panelAfterPoll({
      sessions: [
        session('aaaaaaaa-1', { created_at: 3_000 }),
        session('bbbbbbbb-2', { state: POISON, created_at: 2_000 }),
        session('cccccccc-3', { state: 'STARTING', created_at: 1_000 })
      ]
    });
    expect(sessionCards(panel)).toEqual([
      { id: 'aaaaaaaa-1', state: 'running a program' },
      { id: 'bbbbbbbb-2', state: 'state unknown' },
      { id: 'cccccccc-3', state: 'starting' }
    ]);
  });

  it('shows a fleet label with a malformed key as the router sent it, and still updates sessions and jobs', async () => {
    const router = healthyServer('a', {
      fleet_status: {
        kinds: [{ gpu: 'h100', gpus: 8, default: true, nodes: 2, seats: 16, free_seats: 4 }],
        labels: [
          { key: POISON, value: 'big', nodes: 1 },
          { key: 'pool', value: 'small', nodes: 3 }
        ]
      }
    });
    const panel = await panelAfterPoll({
      servers: [router, healthyServer('b')],
      sessions: [session('aaaaaaaa-1')],
      jobs: [job('ok-1', 1)]
    });
    const fleet = [...panel.node.querySelectorAll('.jp-KCoral-fleet tbody tr')].map(
      row => row.querySelector('td')?.textContent
    );
    expect(fleet).toEqual(['gpu=h100 ×8', `${POISON_JSON}=big`, 'pool=small']);
    const cards = [...panel.node.querySelectorAll<HTMLElement>('.jp-KCoral-server')];
    expect(cards.map(c => c.dataset.server)).toEqual(['a', 'b']);
    expect(sessionCards(panel).map(c => c.id)).toEqual(['aaaaaaaa-1']);
    expect(jobRows(panel).map(r => r.id)).toEqual(['ok-1']);
  });

  it('shows a server whose health status is an object as the JSON it sent', async () => {
    const rogue = healthyServer('rogue');
    (rogue.health as Record<string, unknown>).status = POISON;
    const panel = await panelAfterPoll({
      servers: [rogue, healthyServer('b')],
      jobs: [job('ok-1', 1)]
    });
    const facts = [...panel.node.querySelectorAll('.jp-KCoral-server')].map(
      card => card.querySelector('dd')?.textContent
    );
    expect(facts).toEqual([POISON_JSON, 'ok']);
    expect(jobRows(panel).map(r => r.id)).toEqual(['ok-1']);
  });
});

describe('the servers part of the panel', () => {
  it('says the first cell starts a server when none is known, not that one must be configured', async () => {
    // A soak of the README's path (jupyter lab, then a %%kcoral cell): before the first
    // cell the panel said `No KCoral server is configured (c.KCoralExtension.servers or
    // KCORAL_URL).`, though nothing needs configuring.
    const panel = await panelAfterPoll({ servers: [] });
    expect(text(panel, '.jp-KCoral-servers')).toBe(
      "No KCoral server yet: a notebook's first %%kcoral cell starts one for its kernel " +
        '(or set KCORAL_URL, or c.KCoralExtension.servers).'
    );
  });
});

describe('the jobs table of several servers', () => {
  it('names the server of the jobs when only one of the servers listed has any', async () => {
    // A soak: two notebooks, each on its kernel's local server; the one job listed had no
    // server row over it, and read as the focused notebook's.
    const panel = await panelAfterPoll({
      servers: [healthyServer('a'), healthyServer('b')],
      jobs: [job('job-1', 1)]
    });
    const headings = [...panel.node.querySelectorAll('tr.jp-KCoral-jobServer')].map(
      row => row.textContent
    );
    expect(headings).toEqual(['a']);
    const alone = await panelAfterPoll({ servers: [healthyServer('a')], jobs: [job('job-1', 1)] });
    expect(alone.node.querySelectorAll('tr.jp-KCoral-jobServer').length).toBe(0);
  });
});

describe('the panel while the server extension cannot be asked', () => {
  it('says the extension is not enabled, and that the lists are the last read', async () => {
    // A soak: the panel said `The KCoral server extension cannot be reached.` where its
    // routes answered 404 (kcoral_jupyter not enabled), and kept the jobs and sessions of
    // its last good poll (`running`, `running a program`) with nothing saying they were
    // no longer updated.
    let route = 200;
    const fetcher = async (path: string): Promise<Response> => {
      if (route !== 200) {
        return answer({ message: 'Not Found' }, route);
      }
      if (path === 'servers') {
        return answer({ servers: [healthyServer('a')] });
      }
      if (path === 'jobs') {
        return answer({ jobs: [job('job-1', 1)], errors: [] });
      }
      return answer({ sessions: [session('s-1')], errors: [] });
    };
    const model = new KCoralModel(new KCoralApi(fetcher), {
      pollIntervalMs: 60_000,
      statusServer: ''
    });
    const panel = new KCoralPanel(model);
    opened.push({ panel, model });
    await model.poll();
    expect(text(panel, '.jp-KCoral-jobs .jp-KCoral-note')).toBe('');
    route = 404;
    await model.poll().catch(() => undefined);
    expect(text(panel, '.jp-KCoral-servers')).toBe(
      'The KCoral server extension is not enabled in this Jupyter server: install ' +
        'kcoral[jupyter] where jupyter lab runs and restart it (or run: jupyter server ' +
        'extension enable kcoral_jupyter).'
    );
    const stale = 'As last listed: not updated while the server extension cannot be asked.';
    expect(text(panel, '.jp-KCoral-jobs .jp-KCoral-note')).toBe(stale);
    expect(text(panel, '.jp-KCoral-sessionNote')).toBe(stale);
    route = 200;
    await model.poll();
    expect(text(panel, '.jp-KCoral-jobs .jp-KCoral-note')).toBe('');
    expect(text(panel, '.jp-KCoral-sessionNote')).toBe('');
  });
});

describe('the selected job when its server stops listing it', () => {
  it('says its status is unknown and offers no Cancel, not the running it last had', async () => {
    // A soak: the job's server was stopped (or the kernel that ran the embedded server
    // restarted); the jobs table dropped the job, but the output title kept saying
    // `running · job c84f8fc6` with Cancel enabled, beside `finished: cancelled`.
    let listed = true;
    const fetcher = async (path: string): Promise<Response> => {
      if (path === 'servers') {
        return answer({ servers: [healthyServer('a')] });
      }
      if (path === 'jobs') {
        return listed
          ? answer({ jobs: [job('job-1234-x', 1)], errors: [] })
          : answer({ jobs: [], errors: [{ server: 'a', message: 'not running: nothing answers' }] });
      }
      if (path === 'sessions') {
        return answer({ sessions: [], errors: [] });
      }
      return answer({ error: { kind: 'server_transport', message: 'not running' } }, 502);
    };
    const model = new KCoralModel(new KCoralApi(fetcher), {
      pollIntervalMs: 60_000,
      statusServer: ''
    });
    const panel = new KCoralPanel(model);
    opened.push({ panel, model });
    await model.poll();
    panel.node.querySelector<HTMLElement>('tr.jp-KCoral-job')!.click();
    const cancel = panel.node.querySelector<HTMLButtonElement>('button.jp-KCoral-cancel')!;
    expect(text(panel, '.jp-KCoral-outputTitle')).toBe('running · job job-1234');
    expect([cancel.disabled, panel.canCancelSelected]).toEqual([false, true]);
    listed = false;
    await model.poll();
    expect(text(panel, '.jp-KCoral-outputTitle')).toBe('status unknown · job job-1234');
    expect(panel.node.querySelector<HTMLElement>('.jp-KCoral-outputTitle')!.title).toMatch(
      /does not list it now/
    );
    expect([cancel.disabled, panel.canCancelSelected]).toEqual([true, false]);
    listed = true; // the server answers again and lists it: back to what it says
    await model.poll();
    expect(text(panel, '.jp-KCoral-outputTitle')).toBe('running · job job-1234');
    expect(cancel.disabled).toBe(false);
  });

  /** A panel following job `job-1234-x`, whose event stream sends `stream` and ends;
   * the job is listed while `listed()` says so. Returns once a phase is shown. */
  async function following(stream: string, listed: () => boolean) {
    const scope = globalThis as { TextDecoder?: unknown };
    scope.TextDecoder ??= (await import('util')).TextDecoder;
    const fetcher = async (path: string): Promise<Response> => {
      if (path === 'servers') {
        return answer({ servers: [healthyServer('a')] });
      }
      if (path === 'jobs') {
        return answer({ jobs: listed() ? [job('job-1234-x', 1)] : [], errors: [] });
      }
      if (path === 'sessions') {
        return answer({ sessions: [], errors: [] });
      }
      let sent = false;
      const reader = {
        read: async () =>
          sent ? { done: true } : ((sent = true), { done: false, value: Buffer.from(stream) }),
        cancel: async () => undefined,
        releaseLock: () => undefined
      };
      return { ok: true, status: 200, body: { getReader: () => reader } } as unknown as Response;
    };
    const model = new KCoralModel(new KCoralApi(fetcher), {
      pollIntervalMs: 60_000,
      statusServer: ''
    });
    const panel = new KCoralPanel(model);
    opened.push({ panel, model });
    await model.poll();
    panel.node.querySelector<HTMLElement>('tr.jp-KCoral-job')!.click();
    for (let i = 0; i < 20 && text(panel, '.jp-KCoral-phase') === ''; i++) {
      await new Promise(resolve => setTimeout(resolve, 0));
    }
    return { panel, model };
  }

  it('says the status its live output finished with, not status unknown', async () => {
    // The kernel that ran the job's embedded server restarted: the job's stream said
    // `finished: cancelled`, then its server (and the job) left the list.
    const finished = 'event: phase\nid: 9\ndata: {"phase":"finished","status":"CANCELLED"}\n\n';
    let listed = true;
    const { panel, model } = await following(finished, () => listed);
    expect(text(panel, '.jp-KCoral-phase')).toBe('finished: cancelled');
    listed = false;
    await model.poll();
    expect(text(panel, '.jp-KCoral-outputTitle')).toBe('cancelled · job job-1234');
    expect(panel.canCancelSelected).toBe(false);
  });

  /** A panel following job `job-1234-x` while its server goes away and comes back: while
   * `state.down` the events route answers 502 `not running` (as the server extension
   * does), the jobs list an error for server `a`; after, the stream sends what follows
   * the `Last-Event-ID` it was asked with (`state.resumedFrom`) when `state.keeps`. */
  async function awayAndBack() {
    const scope = globalThis as { TextDecoder?: unknown };
    scope.TextDecoder ??= (await import('util')).TextDecoder;
    // jupyterDown: the Jupyter server is away too (every fetch fails as the browser's does).
    const state = {
      down: false,
      wentAway: false,
      jupyterDown: false,
      keeps: true,
      resumedFrom: [] as string[]
    };
    const events = [
      'event: stdout\nid: 1\ndata: {"text":"step 1\\n"}\n\n',
      'event: stdout\nid: 2\ndata: {"text":"step 2\\n"}\n\n' +
        'event: phase\nid: 3\ndata: {"phase":"finished","status":"COMPLETED"}\n\n'
    ];
    const fetcher = async (path: string, init?: RequestInit): Promise<Response> => {
      if (state.jupyterDown) {
        throw new TypeError('Failed to fetch');
      }
      if (path === 'servers') {
        const server = healthyServer('a');
        return answer({ servers: [state.down ? { ...server, health: null } : server] });
      }
      if (path === 'jobs') {
        if (state.down) {
          return answer({ jobs: [], errors: [{ server: 'a', message: 'not running' }] });
        }
        return answer({ jobs: state.keeps ? [job('job-1234-x', 1)] : [], errors: [] });
      }
      if (path === 'sessions') {
        return answer({ sessions: [], errors: [] });
      }
      const message = 'not running: nothing answers at a:8000';
      if (state.down) {
        return answer({ error: { kind: 'server_transport', message } }, 502);
      }
      const last = (init?.headers as Record<string, string>)['Last-Event-ID'] ?? '';
      if (last) {
        state.resumedFrom.push(last);
      }
      // A stream from the start ends after one event; the first one, the server goes
      // away with it.
      const stream = last ? events[1] : events[0];
      if (!last && !state.wentAway) {
        state.wentAway = true;
        state.down = true;
      }
      let sent = false;
      const reader = {
        read: async () =>
          sent ? { done: true } : ((sent = true), { done: false, value: Buffer.from(stream) }),
        cancel: async () => undefined,
        releaseLock: () => undefined
      };
      return { ok: true, status: 200, body: { getReader: () => reader } } as unknown as Response;
    };
    const model = new KCoralModel(new KCoralApi(fetcher), {
      pollIntervalMs: 60_000,
      statusServer: ''
    });
    const panel = new KCoralPanel(model);
    panel.followRetryMs = 0;
    opened.push({ panel, model });
    await model.poll();
    panel.node.querySelector<HTMLElement>('tr.jp-KCoral-job')!.click();
    for (let i = 0; i < 200 && !/unavailable/.test(text(panel, '.jp-KCoral-phase')); i++) {
      await new Promise(resolve => setTimeout(resolve, 0));
    }
    return { panel, model, state };
  }

  const settle = async (panel: KCoralPanel, pattern: RegExp) => {
    for (let i = 0; i < 200 && !pattern.test(text(panel, '.jp-KCoral-phase')); i++) {
      await new Promise(resolve => setTimeout(resolve, 0));
    }
  };

  it('takes a lost live output up again where it stopped once its server lists the job', async () => {
    // A soak: the followed job's server was away for longer than the reconnects; it came
    // back and listed the job again, but the pane said `live output unavailable: not
    // running: nothing answers at ...` for good, and showed none of the rest.
    const { panel, model, state } = await awayAndBack();
    expect(text(panel, '.jp-KCoral-phase')).toBe(
      'live output unavailable: not running: nothing answers at a:8000'
    );
    await model.poll(); // still away: nothing to take up
    expect(state.resumedFrom).toEqual([]);
    state.down = false;
    await model.poll();
    await settle(panel, /finished/);
    expect(state.resumedFrom).toEqual(['1']);
    expect(text(panel, '.jp-KCoral-phase')).toBe('finished: done');
    expect(panel.node.querySelector('.jp-KCoral-outputText')!.textContent).toBe('step 1\nstep 2\n');
  });

  it('says the Jupyter server cannot be reached, and resumes only once it answers', async () => {
    // A soak: jupyter lab restarted under an open page. The pane said `live output
    // unavailable: Failed to fetch` (the browser's words); its reconnects were spent on
    // polls that had failed too, with the jobs of the last good poll.
    const { panel, model, state } = await awayAndBack();
    state.down = false;
    state.jupyterDown = true;
    panel.select(model.jobs[0]); // followed again from the start, while Jupyter is away
    await settle(panel, /unavailable/);
    expect(text(panel, '.jp-KCoral-phase')).toBe(
      'live output unavailable: the Jupyter server cannot be reached'
    );
    for (let i = 0; i < 5; i++) {
      await model.poll().catch(() => undefined);
    }
    expect(text(panel, '.jp-KCoral-phase')).toBe(
      'live output unavailable: the Jupyter server cannot be reached'
    );
    state.jupyterDown = false;
    await model.poll();
    await settle(panel, /finished/);
    expect(text(panel, '.jp-KCoral-phase')).toBe('finished: done');
  });

  it('says a lost live output ended when its server is no longer listed', async () => {
    // The kernel that used the job's server stopped: the server left the list.
    const { panel, model, state } = await awayAndBack();
    state.down = false;
    model.servers = [];
    model.jobs = [];
    model.jobErrors = [];
    panel.render();
    expect(text(panel, '.jp-KCoral-phase')).toBe(
      'live output ended: its server is no longer listed (no running kernel uses it)'
    );
    expect(state.resumedFrom).toEqual([]);
  });

  it('says a lost live output ended when its server answers again without the job', async () => {
    // The server was restarted: it answers, its jobs list does not have the job; `nothing
    // answers at` was no longer true.
    const { panel, model, state } = await awayAndBack();
    state.down = false;
    state.keeps = false;
    await model.poll();
    expect(text(panel, '.jp-KCoral-phase')).toBe(
      'live output ended: a answers again but does not list this job (it restarted, or no ' +
        'longer keeps the job)'
    );
    expect(text(panel, '.jp-KCoral-outputTitle')).toBe('status unknown · job job-1234');
    expect(state.resumedFrom).toEqual([]);
  });

  it('keeps saying a job waits for the GPU lease until it holds it', async () => {
    // A real fake-GPU server sends `lease_wait`, then the instruction its worker waits in,
    // and `lease_held` only once the other program let go of the GPU.
    const phase = (id: number, data: string): string =>
      `event: phase\nid: ${id}\ndata: ${data}\n\n`;
    const waiting =
      phase(1, '{"phase":"lease_wait"}') +
      phase(2, '{"phase":"instruction","index":0,"op":"upload","id":"upload_0"}');
    const { panel } = await following(waiting, () => true);
    expect(text(panel, '.jp-KCoral-phase')).toBe('waiting for the GPU lease');
    const held =
      waiting +
      phase(3, '{"phase":"lease_held"}') +
      phase(4, '{"phase":"instruction","index":1,"op":"get_function","id":"f"}');
    const after = await following(held, () => true);
    expect(text(after.panel, '.jp-KCoral-phase')).toBe('step 2: loading f');
  });

  it('says why a followed job failed, which its live output never says', async () => {
    // A soak: a failed cell's job, clicked in the panel, said only `finished: failed` over
    // an empty output; the why (ValueError: boom 3) was in its result alone.
    const scope = globalThis as { TextDecoder?: unknown };
    scope.TextDecoder ??= (await import('util')).TextDecoder;
    const asked: string[] = [];
    const stream = 'event: phase\nid: 6\ndata: {"phase":"finished","status":"FAILED"}\n\n';
    const fetcher = async (path: string): Promise<Response> => {
      asked.push(path);
      if (path === 'servers') {
        return answer({ servers: [healthyServer('a')] });
      }
      if (path === 'jobs') {
        return answer({ jobs: [job('job-1234-x', 1, { status: 'FAILED' })], errors: [] });
      }
      if (path === 'sessions') {
        return answer({ sessions: [], errors: [] });
      }
      if (path.startsWith('jobs/job-1234-x/error')) {
        return answer({ kind: 'runtime', message: 'ValueError: boom 3\n  (more)' });
      }
      let sent = false;
      const reader = {
        read: async () =>
          sent ? { done: true } : ((sent = true), { done: false, value: Buffer.from(stream) }),
        cancel: async () => undefined,
        releaseLock: () => undefined
      };
      return { ok: true, status: 200, body: { getReader: () => reader } } as unknown as Response;
    };
    const model = new KCoralModel(new KCoralApi(fetcher), {
      pollIntervalMs: 60_000,
      statusServer: ''
    });
    const panel = new KCoralPanel(model);
    opened.push({ panel, model });
    await model.poll();
    panel.node.querySelector<HTMLElement>('tr.jp-KCoral-job')!.click();
    for (let i = 0; i < 50 && !/boom/.test(text(panel, '.jp-KCoral-phase')); i++) {
      await new Promise(resolve => setTimeout(resolve, 0));
    }
    expect(text(panel, '.jp-KCoral-phase')).toBe('finished: failed · ValueError: boom 3 (more)');
    expect(panel.node.querySelector<HTMLElement>('.jp-KCoral-phase')!.title).toBe(
      'runtime: ValueError: boom 3\n  (more)'
    );
    expect(asked).toContain('jobs/job-1234-x/error?server=a');
  });

  it('marks where the server cut a stream at the output limit', async () => {
    // The pane showed the first output-limit bytes and ended there, as if that were all.
    const stream =
      'event: stdout\nid: 1\ndata: {"text":"abcde"}\n\n' +
      'event: phase\nid: 2\ndata: {"phase":"finished","status":"COMPLETED",' +
      '"stdout_truncated":true,"stderr_truncated":false}\n\n';
    const { panel } = await following(stream, () => true);
    expect(text(panel, '.jp-KCoral-cut')).toBe(
      '[stdout truncated at the output limit: the rest was not kept]'
    );
    expect(panel.node.querySelector('.jp-KCoral-outputText')!.textContent).toBe(
      'abcde[stdout truncated at the output limit: the rest was not kept]'
    );
  });

  it('keeps the note of a cut stream in view below a followed output', async () => {
    // A soak: 1 MiB of output, followed to its end; the note went below that end, out of
    // view, and the pane seemed to end at `line 3`. jsdom has no layout: the pane's is
    // made here, 10 px a line (the note one more), 30 px of it in view.
    const scrolled = new WeakMap<HTMLElement, number>();
    const layout = {
      scrollHeight: {
        get(this: HTMLElement) {
          const lines = (this.textContent ?? '').split('\n').length - 1;
          return 10 * (lines + this.querySelectorAll('.jp-KCoral-cut').length);
        }
      },
      clientHeight: { get: () => 30 },
      scrollTop: {
        get(this: HTMLElement) {
          return scrolled.get(this) ?? 0;
        },
        set(this: HTMLElement, value: number) {
          scrolled.set(this, Math.min(value, this.scrollHeight - this.clientHeight)); // as a browser
        }
      }
    };
    for (const [name, property] of Object.entries(layout)) {
      Object.defineProperty(HTMLPreElement.prototype, name, { ...property, configurable: true });
    }
    try {
      const lines = Array.from({ length: 10 }, (_, i) => `line ${i}\\n`).join('');
      const stream =
        `event: stdout\nid: 1\ndata: {"text":"${lines}"}\n\n` +
        'event: phase\nid: 2\ndata: {"phase":"finished","status":"COMPLETED",' +
        '"stdout_truncated":true}\n\n';
      const { panel } = await following(stream, () => true);
      const pane = panel.node.querySelector<HTMLElement>('.jp-KCoral-outputText')!;
      expect(pane.querySelector('.jp-KCoral-cut')).not.toBeNull();
      expect(pane.scrollTop + pane.clientHeight).toBeGreaterThanOrEqual(pane.scrollHeight);
    } finally {
      for (const name of Object.keys(layout)) {
        delete (HTMLPreElement.prototype as unknown as Record<string, unknown>)[name];
      }
    }
  });

  it('shows a progress bar written with carriage returns as the cell does, without escapes', async () => {
    // A soak: the pane read `loading  50%loading 100%` and `[32m...[0m` where the cell
    // that ran the job showed one green `loading 100%`.
    const chunks = ['\rloading  50%', '\r\x1b[32mloading 100%\x1b[0m\n', 'ready\n'];
    const stream =
      chunks
        .map((chunk, i) => `event: stdout\nid: ${i + 1}\ndata: ${JSON.stringify({ text: chunk })}\n\n`)
        .join('') + 'event: phase\nid: 9\ndata: {"phase":"finished","status":"COMPLETED"}\n\n';
    const { panel } = await following(stream, () => true);
    expect(panel.node.querySelector('.jp-KCoral-outputText')!.textContent).toBe(
      'loading 100%\nready\n'
    );
  });
});
