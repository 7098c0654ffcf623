/**
 * kcoral-jupyterlab: the status bar item, the KCoral side panel, two palette commands and
 * the settings (poll interval, which server the status bar shows).
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, ISessionContext } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { KCoralApi } from './api';
import { kcoralIcon } from './icon';
import { KCoralModel } from './model';
import { KCoralPanel } from './panel';
import { watchForKernelLoss } from './restarts';
import { KCoralStatus } from './statusbar';

const PLUGIN_ID = 'kcoral-jupyterlab:plugin';

export namespace CommandIDs {
  export const showPanel = 'kcoral:show-panel';
  export const cancelJob = 'kcoral:cancel-job';
}

/** The session context of a notebook or console widget, if the widget has one. */
function sessionContextOf(widget: unknown): ISessionContext | null {
  const context = (widget as { sessionContext?: ISessionContext } | null)?.sessionContext;
  return context ?? null;
}

/**
 * Keep `model.focusedKernel` on the kernel of the widget in focus, so that the status bar
 * shows the server that notebook's cells use (each kernel announces its own, EXTENSIONS §6).
 */
function followFocusedKernel(app: JupyterFrontEnd, model: KCoralModel): void {
  let watched: ISessionContext | null = null;
  const watchedForLoss = new WeakSet<object>();
  const update = (): void => {
    model.setFocusedKernel(watched?.session?.kernel?.id ?? null);
  };
  const onFocus = (): void => {
    const context = sessionContextOf(app.shell.currentWidget);
    if (context === null) {
      return; // the file browser or a text editor: keep the last notebook's server
    }
    watchForKernelLoss(app.shell.currentWidget, context, watchedForLoss);
    if (context !== watched) {
      watched?.kernelChanged.disconnect(update);
      watched = context;
      watched.kernelChanged.connect(update);
    }
    update();
  };
  app.shell.currentChanged?.connect(onFocus);
  onFocus();
  // Every notebook is watched as it opens, focused or not: a notebook restored in the
  // background has lines to settle, and its kernel may restart before it is ever focused.
  const watchEvery = (): void => {
    for (const widget of app.shell.widgets('main')) {
      watchForKernelLoss(widget, sessionContextOf(widget), watchedForLoss);
    }
  };
  const shell = app.shell as { layoutModified?: { connect(slot: () => void): void } };
  shell.layoutModified?.connect(watchEvery);
  watchEvery();
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'KCoral status bar item, side panel with servers and jobs, live output.',
  autoStart: true,
  optional: [IStatusBar, ICommandPalette, ISettingRegistry, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null
  ) => {
    const serverSettings = ServerConnection.makeSettings();
    const api = new KCoralApi((path, init) =>
      ServerConnection.makeRequest(
        URLExt.join(serverSettings.baseUrl, 'kcoral', 'api', path),
        init ?? {},
        serverSettings
      )
    );
    const model = new KCoralModel(api, {
      pollIntervalMs: 3000,
      statusServer: ''
    });
    followFocusedKernel(app, model);

    const panel = new KCoralPanel(model);
    panel.title.icon = kcoralIcon;
    app.shell.add(panel, 'right', { rank: 900 });
    restorer?.add(panel, 'kcoral-panel');

    const { commands } = app;
    commands.addCommand(CommandIDs.showPanel, {
      label: 'KCoral: Show panel',
      caption: 'Open the KCoral side panel (servers, jobs, live output)',
      execute: () => {
        app.shell.activateById(panel.id);
        void model.poller.refresh();
      }
    });
    commands.addCommand(CommandIDs.cancelJob, {
      label: 'KCoral: Cancel job',
      caption: 'Cancel the job selected in the KCoral panel (or args.jobId)',
      isEnabled: args => typeof args.jobId === 'string' || panel.canCancelSelected,
      execute: async args => {
        const id = typeof args.jobId === 'string' ? args.jobId : '';
        if (id) {
          const job = model.job(id) ?? { job_id: id, server: undefined };
          await panel.cancel(job as Parameters<KCoralPanel['cancel']>[0]);
        } else {
          await panel.cancelSelected();
        }
      }
    });
    panel.onSelectionChanged(() => commands.notifyCommandChanged(CommandIDs.cancelJob));
    palette?.addItem({ command: CommandIDs.showPanel, category: 'KCoral' });
    palette?.addItem({ command: CommandIDs.cancelJob, category: 'KCoral' });

    if (statusBar) {
      const item = new KCoralStatus(model, () => {
        void commands.execute(CommandIDs.showPanel);
      });
      statusBar.registerStatusItem('kcoral-jupyterlab:status', {
        item,
        align: 'left',
        rank: 100
      });
    }

    const applySettings = (settings: ISettingRegistry.ISettings): void => {
      const seconds = Number(settings.get('pollInterval').composite);
      const server = settings.get('statusServer').composite;
      model.configure(
        Math.max(Number.isFinite(seconds) ? seconds : 3, 0.5) * 1000,
        typeof server === 'string' ? server : ''
      );
    };
    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          applySettings(settings);
          settings.changed.connect(applySettings);
        })
        .catch(reason => console.error('KCoral: settings could not be loaded', reason))
        .finally(() => model.start());
    } else {
      model.start();
    }
  }
};

export default plugin;
