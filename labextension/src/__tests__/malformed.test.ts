/*
 * Records of the wrong types from a broken or rogue KCoral server, at the boundary (api.ts,
 * sse.ts) and in the formatting functions that read them (format.ts, which must not throw
 * even on records that were never checked). panel.test.ts renders the same in the panel.
 */

import { ApiError, IInfo, IJob, ISession, KCoralApi } from '../api';
import {
  describePhase,
  fleetRows,
  formatGpus,
  formatTime,
  jobCells,
  jobStatusClass,
  jobStatusText,
  jobTitle,
  newestFirst,
  sessionView
} from '../format';
import { decodeJobEvent } from '../sse';
import { shownText } from '../text';
import { jsonResponse } from './helpers';

/** JSON whose own `toString` is no function: `String()` and template literals throw on it. */
const POISON_JSON = '{"toString":1,"valueOf":1}';
const poison = (): unknown => JSON.parse(POISON_JSON);

function answering(body: unknown): KCoralApi {
  return new KCoralApi(async () => jsonResponse(body));
}

describe('shownText', () => {
  it('shows strings as they are, numbers and booleans as written, and other JSON as JSON', () => {
    expect(['a', 3, true, null, undefined, [1, 'b'], poison()].map(shownText)).toEqual([
      'a',
      '3',
      'true',
      '',
      '',
      '[1,"b"]',
      POISON_JSON
    ]);
  });

  it('says ? rather than throwing on what even JSON cannot write', () => {
    const cycle: Record<string, unknown> = {};
    cycle.self = cycle;
    expect([shownText(cycle), shownText(Symbol('s'))]).toEqual(['?', '?']);
  });
});

describe('job records checked at the boundary', () => {
  it('keeps only the fields of the right type', async () => {
    const { jobs } = await answering({
      jobs: [
        {
          job_id: 'j1',
          status: poison(),
          submitted_at: poison(),
          started_at: 5,
          worker_id: poison(),
          gpu_ids: 'x',
          elapsed_ms: '12',
          queue_ms: 3,
          error_kind: ['x'],
          waiting_for: { gpus: true },
          target: 'sm_90a',
          server: 7
        },
        { job_id: 'j2', status: 'RUNNING', gpu_ids: [0, 'x', 1, null], worker_id: 3 }
      ],
      errors: []
    }).jobs();
    expect(jobs[0]).toEqual({
      job_id: 'j1',
      request_id: '',
      status: '',
      submitted_at: null,
      started_at: null,
      finished_at: null,
      worker_id: null,
      gpu_ids: null,
      target: null,
      queue_position: null,
      queue_ms: 3,
      lease_wait_ms: null,
      lease_held_ms: null,
      elapsed_ms: null,
      error_kind: null,
      waiting_for: null,
      observed_at: null
    });
    expect([jobs[1].gpu_ids, jobs[1].worker_id]).toEqual([[0, 1], 3]);
  });

  it('drops records without a string job id and says how many, per server', async () => {
    const list = await answering({
      jobs: [
        { job_id: 12345, server: 'gpu' },
        { job_id: '', server: 'gpu' },
        null,
        { job_id: 'ok', server: 'gpu' }
      ],
      errors: [{ server: 'cpu', message: 'no jobs API' }, { server: poison(), message: 3 }]
    }).jobs();
    expect(list.jobs.map(j => j.job_id)).toEqual(['ok']);
    expect(list.errors).toEqual([
      { server: 'cpu', message: 'no jobs API' },
      { server: POISON_JSON, message: '3' },
      { server: 'gpu', message: '2 job records without a job id are not shown' },
      { server: '', message: '1 job record without a job id is not shown' }
    ]);
  });

  it('refuses a single job answer without a job id rather than returning it', async () => {
    await expect(answering({ job_id: 5 }).job('5')).rejects.toThrow(
      'the server sent no job record for job 5'
    );
  });

  it('reads an error answer whose message is no string as its status line', async () => {
    const api = new KCoralApi(async () =>
      jsonResponse({ error: { kind: poison(), message: poison() } }, 502)
    );
    const error = (await api.cancel('j').catch(e => e)) as ApiError;
    expect(error).toBeInstanceOf(ApiError);
    expect([error.kind, error.message]).toEqual(['', 'HTTP 502']);
  });
});

describe('session records checked at the boundary', () => {
  it('reads a state of the wrong type as unknown and drops records without an id', async () => {
    const list = await answering({
      sessions: [
        { session_id: 's1', state: poison(), owner: poison(), gpu_ids: 'x', server: 'a' },
        { session_id: 7, server: 'a' }
      ],
      errors: []
    }).sessions();
    expect(list.sessions.map(s => [s.session_id, s.state, s.owner, s.gpu_ids])).toEqual([
      ['s1', '', '', null]
    ]);
    expect(list.errors).toEqual([
      { server: 'a', message: '1 session record without a session id is not shown' }
    ]);
  });

  it('answers a stop with no session record as null', async () => {
    expect(await answering({ state: 'ENDED' }).stopSession('s1')).toBeNull();
  });
});

describe('server entries checked at the boundary', () => {
  it('shows a health status of the wrong type as its JSON and fleet labels as text', async () => {
    const [entry] = await answering({
      servers: [
        {
          name: 'router',
          url: 'http://r',
          notebooks: ['a.ipynb', poison()],
          health: {
            status: poison(),
            load: { request_capacity: 2, requests_in_progress: 0, requests_waiting: 0 }
          },
          info: {
            kcoral: '0.1.0',
            fleet_status: {
              kinds: [{ gpu: poison(), nodes: 'many' }, 'x'],
              labels: [{ key: poison(), value: 3, nodes: 1 }, null]
            }
          }
        }
      ]
    }).servers();
    expect(entry.health?.status).toBe(POISON_JSON);
    expect(entry.notebooks).toEqual(['a.ipynb']);
    expect(fleetRows(entry.info).map(r => r.cells[0])).toEqual([
      'gpu=?',
      `${POISON_JSON}=3`
    ]);
    expect(entry.info?.fleet_status?.kinds[0].nodes).toBeNull();
  });
});

describe('the formatting functions, given records that were never checked', () => {
  const raw = (over: Record<string, unknown>): IJob =>
    ({ job_id: 'j', status: 'RUNNING', submitted_at: null, ...over }) as unknown as IJob;

  it('shows GPU ids that are no list as none', () => {
    expect([formatGpus('x'), formatGpus([0, 'x', 2]), formatGpus(null)]).toEqual([
      '–',
      '0,2',
      '–'
    ]);
    expect(jobCells(raw({ worker_id: 'w', gpu_ids: 'x' }))[2]).toBe('w');
    expect(jobTitle(raw({ gpu_ids: 'x' }))).not.toContain('lease');
  });

  it('shows a status or time that is a JSON object without throwing', () => {
    expect(jobStatusText(poison())).toBe(POISON_JSON.toLowerCase());
    expect(jobStatusText('')).toBe('–');
    expect(formatTime(poison())).toBe('–');
    expect(jobCells(raw({ status: poison(), submitted_at: poison() })).slice(0, 2)).toEqual([
      POISON_JSON.toLowerCase(),
      '–'
    ]);
    expect(newestFirst([raw({ submitted_at: poison() })])).toHaveLength(1);
  });

  it('says a numeric job id in the tooltip as the number it is', () => {
    expect(jobTitle(raw({ job_id: 12345 }))).toMatch(/^job 12345\n/);
  });

  it('turns only the statuses the protocol defines into class names', () => {
    expect(
      ['RUNNING', 'TIMED_OUT', 'RUNNING evil', 'toString', poison(), ''].map(jobStatusClass)
    ).toEqual(['jp-KCoral-status-RUNNING', 'jp-KCoral-status-TIMED_OUT', '', '', '', '']);
  });

  it('shows a fleet label whose key is a JSON object as that JSON', () => {
    const info = {
      fleet_status: { kinds: [], labels: [{ key: poison(), value: 'x', nodes: 1 }] }
    } as unknown as IInfo;
    expect(fleetRows(info).map(r => r.cells)).toEqual([
      [`${POISON_JSON}=x`, '1', '–', '–', '–']
    ]);
  });

  it('says a session state it cannot read is unknown', () => {
    const session = { session_id: 's1', state: poison() } as unknown as ISession;
    expect(sessionView(session, 0).state).toBe(POISON_JSON.toLowerCase());
    const nameless = { session_id: 5, state: '' } as unknown as ISession;
    expect([sessionView(nameless, 0).state, sessionView(nameless, 0).shortId]).toEqual([
      'state unknown',
      '5'
    ]);
  });

  it("describes a phase whose op, worker or status is a JSON object as that JSON", () => {
    expect(describePhase('instruction', { index: 2, op: poison(), id: null })).toBe(
      `step 3: ${POISON_JSON}`
    );
    expect(describePhase('assigned', { worker_id: poison() })).toBe(
      `assigned to worker ${POISON_JSON}`
    );
    expect(describePhase('finished', { status: poison() })).toBe(
      `finished: ${POISON_JSON.toLowerCase()}`
    );
  });
});

describe('phase events checked at the boundary', () => {
  it('keeps primitive fields and turns objects, lists and odd names into their JSON', () => {
    const event = decodeJobEvent({
      event: 'phase',
      id: '4',
      data: `{"phase":"instruction","index":2,"op":${POISON_JSON},"gpu_ids":[0],"id":null}`
    });
    expect(event).toEqual({
      kind: 'phase',
      id: '4',
      phase: 'instruction',
      fields: { index: 2, op: POISON_JSON, gpu_ids: '[0]', id: null }
    });
    if (event.kind === 'phase') {
      expect(describePhase(event.phase, event.fields)).toBe(`step 3: ${POISON_JSON}`);
    }
    const named = decodeJobEvent({ event: 'phase', id: '5', data: `{"name":${POISON_JSON}}` });
    expect(named).toMatchObject({ kind: 'phase', phase: POISON_JSON });
  });
});
