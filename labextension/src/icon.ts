/** The side bar icon: a small coral branch. */

import { LabIcon } from '@jupyterlab/ui-components';

const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 15h2v-5l3-3V3h-1.6v3.3L9 7.7V1H7v6.7L5.6 6.3V3H4v4l3 3z"/>
  </g>
</svg>`;

export const kcoralIcon = new LabIcon({ name: 'kcoral-jupyterlab:coral', svgstr: svg });
