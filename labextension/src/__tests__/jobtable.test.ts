import { IJob, IServerEntry } from '../api';
import {
  formatDuration,
  JOB_COLUMNS,
  jobCells,
  jobStateText,
  jobStatusText,
  jobTitle,
  serverLabel
} from '../format';

const job = (over: Partial<IJob> = {}): IJob => ({
  job_id: '0b8e6f1c-2f4b-4c59-9f1e-6f3a1f1f2c11',
  request_id: 'r',
  status: 'COMPLETED',
  submitted_at: '2026-12-01T12:34:56Z',
  started_at: null,
  finished_at: null,
  worker_id: 'cpu/w0',
  gpu_ids: [],
  target: null,
  queue_position: null,
  queue_ms: 0.25,
  lease_wait_ms: 0,
  lease_held_ms: 0,
  elapsed_ms: 11.09000004362315,
  error_kind: null,
  waiting_for: null,
  ...over
});

describe('the jobs table', () => {
  it('has four short columns, which fit the default side-bar width', () => {
    expect(JOB_COLUMNS.map(c => c.name)).toEqual(['Status', 'Submitted', 'Worker', 'Time']);
    const cells = jobCells(job());
    expect(cells).toHaveLength(JOB_COLUMNS.length);
    // About 6 px per character at the panel's 11 px font: the four cells and their padding
    // stay well under the ~300 px of JupyterLab's default right side bar.
    expect(cells.join('').length).toBeLessThanOrEqual(32);
    expect(cells[3]).toBe('11 ms');
  });

  it('puts GPU ids next to the worker and the split of the time in the tooltip', () => {
    const cells = jobCells(job({ worker_id: 'gpu/w1', gpu_ids: [0, 1] }));
    expect(cells[2]).toBe('gpu/w1 · GPU 0,1');
    const title = jobTitle(job({ server: 'gpu', error_kind: 'timeout', gpu_ids: [0] }));
    expect(title).toContain('on gpu (timeout)');
    expect(title).toContain('queue 0 ms · lease wait 0 ms · held 0 ms · run 11 ms');
  });

  it('says no GPU lease in the tooltip of a CPU job', () => {
    const title = jobTitle(job({ worker_id: 'cpu/w0', gpu_ids: [] }));
    expect(title).toContain('queue 0 ms · run 11 ms');
    expect(title).not.toContain('lease');
  });

  it('counts a running or queued job time so far on its server clock', () => {
    // Their records have no elapsed_ms before they end: a job running for minutes said `–`.
    const observedAt = Date.parse('2026-12-01T12:37:12Z') / 1000; // the server's Date header
    const running = job({
      status: 'RUNNING',
      started_at: '2026-12-01T12:35:00.600Z',
      queue_ms: 1500,
      elapsed_ms: null,
      observed_at: observedAt
    });
    expect(jobCells(running)[3]).toBe('2 min 12 s'); // 131.4 s of run + 1.5 s of queue
    expect(jobTitle(running)).toContain('queue 1.5 s · run 2 min 11 s so far');
    const queued = job({
      status: 'QUEUED',
      submitted_at: '2026-12-01T12:37:07.200Z',
      queue_ms: null,
      elapsed_ms: null,
      observed_at: observedAt
    });
    expect(jobCells(queued)[3]).toBe('4 s');
    expect(jobTitle(queued)).toContain('queue 4 s so far · run –');
    // A browser clock ahead of the server's never makes it negative; without the server's
    // clock nothing is guessed; a finished job keeps its record's times.
    expect(jobCells({ ...queued, observed_at: observedAt - 60 })[3]).toBe('0 s');
    expect(jobCells({ ...running, observed_at: null })[3]).toBe('–');
    expect(jobCells(job({ observed_at: observedAt }))[3]).toBe('11 ms');
  });

  it('rounds durations to what a narrow column can show', () => {
    expect(formatDuration(null)).toBe('–');
    expect(formatDuration(0.011)).toBe('0 ms');
    expect(formatDuration(3456)).toBe('3.5 s');
    expect(formatDuration(125000)).toBe('2 min 5 s');
  });
});

describe('the words of the jobs table', () => {
  it('says each status as a person would', () => {
    expect(
      ['QUEUED', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED', 'TIMED_OUT', 'ERROR'].map(
        jobStatusText
      )
    ).toEqual(['queued', 'running', 'done', 'failed', 'cancelled', 'timed out', 'error']);
    expect(jobStatusText('SOMETHING_NEW')).toBe('something new');
    expect(jobStatusText('toString')).toBe('tostring');
    expect(jobCells(job())[0]).toBe('done');
  });

  it('says a running job that waits for its GPUs is waiting, not running', () => {
    // EXTENSIONS §5: its status stays RUNNING (it has its worker) while `waiting_for` is
    // "gpus"; the table and the output pane said `running` all the while.
    const waiting = job({ status: 'RUNNING', waiting_for: 'gpus', elapsed_ms: null });
    expect(jobCells(waiting)[0]).toBe('GPU wait');
    expect(jobStateText(waiting)).toBe('waiting for GPU');
    expect(jobTitle(waiting)).toContain('waiting for its GPUs: another program holds them');
    expect(jobStateText(job({ status: 'RUNNING' }))).toBe('running');
    expect(jobTitle(job({ status: 'RUNNING' }))).not.toContain('waiting');
    // A finished job's leftover field, or a word the protocol does not define, changes nothing.
    expect(jobStateText(job({ status: 'COMPLETED', waiting_for: 'gpus' }))).toBe('done');
    expect(jobStateText(job({ status: 'RUNNING', waiting_for: 'disk' }))).toBe('running');
  });

  it('names the server of a job by its label', () => {
    const servers = [
      { name: 'local-31932', label: 'local server of quickstart.ipynb' },
      { name: 'kernel-f76ef9e1', label: '127.0.0.1:8123' },
      { name: 'gpu' }
    ] as IServerEntry[];
    expect(serverLabel(servers, 'local-31932')).toBe('local server of quickstart.ipynb');
    expect(serverLabel(servers, 'gpu')).toBe('gpu');
    expect(serverLabel(servers, 'gone')).toBe('gone');
    expect(jobTitle(job({ server: 'local-31932' }), serverLabel(servers, 'local-31932'))).toContain(
      'on local server of quickstart.ipynb'
    );
  });
});
