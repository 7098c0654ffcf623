import { IVisibility, Poller } from '../poller';

class FakeVisibility implements IVisibility {
  isHidden = false;
  listeners = new Set<() => void>();
  hidden(): boolean {
    return this.isHidden;
  }
  onChange(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
  set(hidden: boolean): void {
    this.isHidden = hidden;
    this.listeners.forEach(l => l());
  }
}

/** Lets the task's promise settle and the poller schedule its next timer. */
async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) {
    await Promise.resolve();
  }
}

describe('Poller', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  it('polls at once and then every interval while polls succeed', async () => {
    const task = jest.fn().mockResolvedValue(undefined);
    const poller = new Poller({ task, intervalMs: 1000 });
    poller.start();
    await settle();
    expect(task).toHaveBeenCalledTimes(1);
    await jest.advanceTimersByTimeAsync(999);
    expect(task).toHaveBeenCalledTimes(1);
    await jest.advanceTimersByTimeAsync(1);
    expect(task).toHaveBeenCalledTimes(2);
    await jest.advanceTimersByTimeAsync(3000);
    expect(task).toHaveBeenCalledTimes(5);
    poller.stop();
  });

  it('backs off exponentially on failures up to the maximum, then resets on success', async () => {
    let fail = true;
    const task = jest.fn(() => (fail ? Promise.reject(new Error('down')) : Promise.resolve()));
    const poller = new Poller({ task, intervalMs: 1000, maxIntervalMs: 5000, backoffFactor: 2 });
    poller.start();
    await settle();
    expect(poller.failures).toBe(1);
    expect(poller.delayMs).toBe(2000);
    await jest.advanceTimersByTimeAsync(2000);
    expect(poller.delayMs).toBe(4000);
    await jest.advanceTimersByTimeAsync(4000);
    expect(poller.delayMs).toBe(5000);
    await jest.advanceTimersByTimeAsync(5000);
    expect(poller.delayMs).toBe(5000);
    expect(task).toHaveBeenCalledTimes(4);
    fail = false;
    await jest.advanceTimersByTimeAsync(5000);
    expect(poller.failures).toBe(0);
    expect(poller.delayMs).toBe(1000);
    poller.stop();
  });

  it('pauses while the page is hidden and polls at once when it is shown again', async () => {
    const visibility = new FakeVisibility();
    const task = jest.fn().mockResolvedValue(undefined);
    const poller = new Poller({ task, intervalMs: 1000, visibility });
    poller.start();
    await settle();
    visibility.set(true);
    expect(poller.scheduled).toBe(false);
    await jest.advanceTimersByTimeAsync(60_000);
    expect(task).toHaveBeenCalledTimes(1);
    visibility.set(false);
    await settle();
    expect(task).toHaveBeenCalledTimes(2);
    expect(poller.scheduled).toBe(true);
    poller.stop();
    expect(visibility.listeners.size).toBe(0);
  });

  it('does not poll at start when the page is already hidden', async () => {
    const visibility = new FakeVisibility();
    visibility.isHidden = true;
    const task = jest.fn().mockResolvedValue(undefined);
    const poller = new Poller({ task, intervalMs: 1000, visibility });
    poller.start();
    await jest.advanceTimersByTimeAsync(10_000);
    expect(task).not.toHaveBeenCalled();
    poller.stop();
  });

  it('never runs two polls at once: a refresh during a poll runs right after it', async () => {
    let release: () => void = () => undefined;
    let active = 0;
    let most = 0;
    const task = jest.fn(
      () =>
        new Promise<void>(resolve => {
          active++;
          most = Math.max(most, active);
          release = () => {
            active--;
            resolve();
          };
        })
    );
    const poller = new Poller({ task, intervalMs: 1000 });
    poller.start();
    void poller.refresh();
    void poller.refresh();
    expect(task).toHaveBeenCalledTimes(1);
    release();
    await settle();
    expect(task).toHaveBeenCalledTimes(2);
    release();
    await settle();
    expect(most).toBe(1);
    expect(task).toHaveBeenCalledTimes(2);
    poller.stop();
  });

  it('stops polling when stopped, and a new interval applies to the next poll', async () => {
    const task = jest.fn().mockResolvedValue(undefined);
    const poller = new Poller({ task, intervalMs: 1000 });
    poller.start();
    await settle();
    poller.setInterval(250);
    await jest.advanceTimersByTimeAsync(250);
    expect(task).toHaveBeenCalledTimes(2);
    poller.stop();
    await jest.advanceTimersByTimeAsync(10_000);
    expect(task).toHaveBeenCalledTimes(2);
  });
});
