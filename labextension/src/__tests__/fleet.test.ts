import { IInfo, KCoralApi } from '../api';
import { fleetRows, waitText } from '../format';
import { jsonResponse } from './helpers';

const load = (free: number, seats: number, queued: number, wait: number | null) => ({
  nodes: 2,
  seats,
  free_seats: free,
  queued,
  recent_programs: wait === null ? 0 : 4,
  estimated_wait_seconds: wait
});

const router: IInfo = {
  kcoral: '0.1.0',
  protocol: 1,
  features: ['jobs'],
  device: 'gpu',
  fleet_status: {
    kinds: [
      { gpu: 'h100', arch: 'sm_90a', gpus: 8, default: true, ...load(0, 16, 5, 192) },
      { gpu: 'cpu', arch: null, gpus: 0, default: false, ...load(2, 2, 0, null) }
    ],
    labels: [{ key: 'pool', value: 'big', ...load(0, 16, 5, 192) }]
  }
};

describe('the fleet table', () => {
  it('has a row per kind, the default first and marked, then a row per label', () => {
    const rows = fleetRows(router);
    expect(rows.map(r => r.cells)).toEqual([
      ['gpu=h100 ×8', '2', '0/16', '5', '3.2 min'],
      ['gpu=cpu', '2', '2/2', '0', '–'],
      ['pool=big', '2', '0/16', '5', '3.2 min']
    ]);
    expect(rows.map(r => r.isDefault)).toEqual([true, false, false]);
    expect(rows[0].title).toBe(
      'gpu=h100 sm_90a ×8: the default kind (requests without --select go here)'
    );
  });

  it('is empty for a direct server and says – for what a row does not say', () => {
    expect(fleetRows({ kcoral: '0.1.0', protocol: 1, features: [], device: 'cpu' })).toEqual([]);
    expect(fleetRows(null)).toEqual([]);
    const odd = {
      ...router,
      fleet_status: { kinds: [{ gpu: null, nodes: 1 }], labels: 'x' }
    } as unknown as IInfo;
    expect(fleetRows(odd).map(r => r.cells)).toEqual([['gpu=?', '1', '–', '–', '–']]);
  });

  it('says the nodes not serving beside a kind, and gives a kind with none ready a row', () => {
    const cpu = { gpu: 'cpu', arch: null, gpus: 0, default: false };
    const a100 = { gpu: 'a100', arch: 'sm_80', gpus: 4, default: false };
    const draining = {
      ...router,
      fleet_status: {
        ...router.fleet_status,
        not_ready: [
          { ...cpu, states: { draining: 1, unhealthy: 1 } },
          { ...a100, states: { left: 1 } }
        ]
      }
    } as IInfo;
    expect(fleetRows(draining).map(r => r.cells)).toEqual([
      ['gpu=h100 ×8', '2', '0/16', '5', '3.2 min'],
      ['gpu=cpu', '2/4 ready · 1 draining · 1 unhealthy', '2/2', '0', '–'],
      ['gpu=a100 ×4', '0/1 ready · 1 left', '–', '–', '–'],
      ['pool=big', '2', '0/16', '5', '3.2 min']
    ]);
  });

  it('reads a state no router names as other and drops counts that are no count', async () => {
    const notReady = [
      { gpu: 'cpu', states: { draining: 1, '\u001b[2Jevil': 2, left: true, x: -1 } },
      'junk'
    ];
    const info = { kcoral: '0.1.0', fleet_status: { kinds: [], labels: [], not_ready: notReady } };
    const body = { servers: [{ name: 'router', url: 'http://r', info }] };
    const [entry] = await new KCoralApi(async () => jsonResponse(body)).servers();
    expect(fleetRows(entry.info).map(r => r.cells)).toEqual([
      ['gpu=cpu', '0/3 ready · 1 draining · 2 other', '–', '–', '–']
    ]);
  });

  it('says a wait in few characters', () => {
    expect([0, 0.4, 12.4, 192, 7200, null, NaN].map(waitText)).toEqual([
      '0 s',
      '<1 s',
      '12 s',
      '3.2 min',
      '2.0 h',
      '–',
      '–'
    ]);
  });
});
