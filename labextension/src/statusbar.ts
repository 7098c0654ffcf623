/** The status bar item: `KCoral ● <target> · <busy>/<capacity> busy · <n> queued`. */

import { Widget } from '@lumino/widgets';

import { statusText, statusTitle } from './format';
import { KCoralModel } from './model';

export class KCoralStatus extends Widget {
  private readonly _dot: HTMLSpanElement;
  private readonly _text: HTMLSpanElement;
  private readonly _unsubscribe: () => void;

  constructor(
    private readonly _model: KCoralModel,
    onClick: () => void
  ) {
    super();
    this.id = 'kcoral-status';
    this.addClass('jp-KCoral-status');
    // JupyterLab's own status text style (its line height): the text sat 4 px above the
    // other items' text.
    this.addClass('jp-StatusBar-TextItem');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    const label = document.createElement('span');
    label.textContent = 'KCoral ';
    this._dot = document.createElement('span');
    this._dot.className = 'jp-KCoral-dot';
    this._dot.textContent = '●';
    this._text = document.createElement('span');
    this._text.className = 'jp-KCoral-statusText';
    this.node.append(label, this._dot, this._text);
    this.node.addEventListener('click', onClick);
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        onClick();
      }
    });
    this._unsubscribe = _model.subscribe(() => this.render());
    this.render();
  }

  render(): void {
    const summary = this._model.summary;
    // The whole text is one string so tests and screen readers see what the spec says.
    const text = statusText(summary); // `KCoral <dot> <rest>`
    this.node.setAttribute('aria-label', text);
    this._dot.textContent = text.charAt('KCoral '.length);
    this._text.textContent = ' ' + text.slice('KCoral ● '.length);
    this.node.title = statusTitle(summary);
    const state = summary.notYet
      ? 'none'
      : !summary.online
        ? 'offline'
        : summary.problem
          ? 'refused'
          : 'online';
    this.node.dataset.state = state;
    this.node.classList.toggle('jp-KCoral-offline', state === 'offline');
    this.node.classList.toggle('jp-KCoral-noWorker', summary.online && summary.capacity === 0);
    this.node.classList.toggle('jp-KCoral-refused', state === 'refused');
  }

  dispose(): void {
    this._unsubscribe();
    super.dispose();
  }
}
