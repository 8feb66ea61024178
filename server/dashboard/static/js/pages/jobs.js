// The team's tuning jobs, polled: state, model, target and host, trials, best estimated latency, elapsed time, and
// cancel (queued, running) / resume (failed, cancelled) buttons. New jobs start from a model's page.

import {get, post} from "../api.js";
import {h, message, replace, section} from "../dom.js";
import {duration, latency, shortHost, targetKind} from "../format.js";
import {Table} from "../table.js";
import {actionButton, badge, errorText, link, live, pageHeader} from "../ui.js";

export const title = "Jobs";
const POLL_MS = 2500;

const CANCELLABLE = ["queued", "running"];
const RESUMABLE = ["failed", "cancelled"];
export const TERMINAL = ["succeeded", "failed", "cancelled"];

/** Elapsed wall time: the search's own account (over every attempt) once it has one, else since it started. */
export function elapsed(job, now = Date.now()) {
  if (job.state === "running" && job.started_at && !job.tuning_s) return (now - Date.parse(job.started_at)) / 1000;
  return job.tuning_s || null;
}

/** Cancel / Resume buttons for a job in a state that has one; `after(job)` gets the job the server answers. */
export function jobActions(job, report, after) {
  const buttons = [];
  if (CANCELLABLE.includes(job.state) && !job.cancel_requested) {
    buttons.push(actionButton("Cancel", async () => {
      const updated = await post(`jobs/${job.id}/cancel`);
      after(updated);
      return updated.state === "cancelled" ? `Job ${job.id} cancelled.` : `Job ${job.id} stops at the end of its round.`;
    }, {report, ariaLabel: `Cancel job ${job.id}`, kind: "danger"}));
  }
  if (RESUMABLE.includes(job.state)) {
    buttons.push(actionButton("Resume", async () => {
      after(await post(`jobs/${job.id}/resume`));
      return `Job ${job.id} queued again.`;
    }, {report, ariaLabel: `Resume job ${job.id}`}));
  }
  if (job.cancel_requested && job.state === "running") buttons.push(h("span", {class: "muted"}, "stopping…"));
  return h("span", {class: "actions"}, buttons);
}

export function render(root, view) {
  const report = h("div", {class: "report"});
  let poller = null;
  const table = new Table([
    {key: "id", label: "ID", numeric: true, cell: (j) => link(`#/jobs/${j.id}`, `#${j.id}`)},
    {key: "state", label: "State", cell: (j) => badge(j.state)},
    {key: "model_name", label: "Model", cell: (j) => link(`#/models/${j.model_id}`, j.model_name)},
    {key: "target_kind", label: "Kind", value: targetKind, cell: (j) => h("span", {class: `kind kind-${targetKind(j)}`},
      targetKind(j))},
    {key: "host", label: "Target / host", cell: (j) => h("span", {title: j.host}, `${j.target} · ${shortHost(j.host)}`)},
    {key: "trials_done", label: "Trials", numeric: true, cell: (j) => `${j.trials_done} / ${j.trials}`},
    {key: "estimated_latency_s", label: "Best est. latency", numeric: true, cell: (j) => latency(j.estimated_latency_s)},
    {key: "tuning_s", label: "Elapsed", numeric: true, value: (j) => elapsed(j), cell: (j) => duration(elapsed(j))},
    {key: "actions", label: "", sortable: false, cell: (j) => jobActions(j, report, () => poller.now())},
  ], {caption: "Tuning jobs, newest first", empty: "No jobs yet: start one from a model's page.", sortable: true,
    rowKey: (j) => j.id});
  const status = h("div");
  root.append(pageHeader("Jobs"), report, section("Tuning jobs", status, table.wrapper));
  poller = live(view, POLL_MS, (signal) => get("jobs", {limit: 200}, {signal}), (jobs) => {
    replace(status);
    table.update(jobs);
  }, (error) => replace(status, message(`Could not load the jobs: ${errorText(error)}`, "error")));
}
