// The measurement farm's workers: kind, a GPU worker's GPU (name, SMs, compute capability, memory), fingerprint,
// queues, last heartbeat, measurements done, the batch (and job) each is on, and whether it is alive, lost (silent
// past the grace period) or stopped.

import {get} from "../api.js";
import {h, message, replace, section} from "../dom.js";
import {ago, count, gpuLine, shortHost} from "../format.js";
import {Table} from "../table.js";
import {badge, errorText, link, pageHeader} from "../ui.js";

export const title = "Workers";
const POLL_MS = 2500;

/** alive / lost / stopped (the API's field; before it had one, only alive or not). */
function workerState(w) {
  return w.state || (w.alive ? "alive" : "lost");
}

function current(w) {
  if (!w.current_batch && w.current_job === null) return "idle";
  const parts = [];
  if (w.current_job !== null && w.current_job !== undefined) parts.push(link(`#/jobs/${w.current_job}`, `job ${w.current_job}`));
  if (w.current_task !== null && w.current_task !== undefined) parts.push(` task ${w.current_task}`);
  if (w.current_batch) parts.push(" ", h("code", {title: w.current_batch}, `batch ${w.current_batch.slice(0, 8)}`));
  return h("span", {}, parts);
}

export function render(root, view) {
  const status = h("div");
  const table = new Table([
    {key: "name", label: "Name"},
    {key: "state", label: "State", value: workerState, cell: (w) => badge(workerState(w))},
    {key: "kind", label: "Kind"},
    {key: "gpu", label: "GPU", value: (w) => (w.gpu ? w.gpu.name : ""), cell: (w) => h("span", {class: "gpu",
      title: w.gpu ? `CUDA ${w.gpu.cuda_version}, driver ${w.gpu.driver_release || "unknown"}, ${w.gpu.sm_clock_mhz} MHz`
        : ""}, gpuLine(w.gpu))},
    {key: "fingerprint", label: "Fingerprint", cell: (w) => h("code", {title: w.fingerprint || ""}, shortHost(w.fingerprint))},
    {key: "queues", label: "Queues", value: (w) => w.queues.join(", "), cell: (w) => h("span", {class: "queues"},
      w.queues.join(", "))},
    {key: "hostname", label: "Host (pid)", cell: (w) => `${w.hostname || "—"}${w.pid ? ` (${w.pid})` : ""}`},
    {key: "last_heartbeat", label: "Last heartbeat", cell: (w) => h("span", {title: w.last_heartbeat},
      ago(w.last_heartbeat))},
    {key: "measurements_done", label: "Measurements", numeric: true, cell: (w) => count(w.measurements_done)},
    {key: "current_batch", label: "Current batch", sortable: false, cell: current},
  ], {caption: "Workers of the farm (shared by every team)", empty: "No worker has registered.", sortable: true,
    rowKey: (w) => w.name, rowClass: (w) => `worker-${workerState(w)}`});
  root.append(pageHeader("Workers"), section("Workers", status, table.wrapper));
  // redrawn on every answer, even an unchanged one: "12 s ago" moves on by itself
  view.every(POLL_MS, async () => {
    try {
      const workers = await get("workers", undefined, {signal: view.signal});
      if (!view.open) return;
      replace(status);
      table.update(workers);
    } catch (error) {
      if (error.name !== "AbortError") replace(status, message(`Could not load the workers: ${errorText(error)}`,
        "error"));
    }
  });
}
