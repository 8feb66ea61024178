// Compiled artifacts: model, target and host, size, sha256, the records each used (expandable), state, and a
// download button that fetches with the token, checks the sha256 and saves the .tar under its own name.

import {download, get} from "../api.js";
import {h, message, replace, section} from "../dom.js";
import {bytes, latency, shortHost, when} from "../format.js";
import {Table} from "../table.js";
import {actionButton, badge, errorText, link, live, pageHeader} from "../ui.js";

export const title = "Artifacts";
const POLL_MS = 2500;

function recordsUsed(artifact) {
  const used = artifact.records_used || [];
  if (!used.length) return artifact.state === "ready" ? "none (default schedules)" : "—";
  return h("details", {},
    h("summary", {}, `${used.length} record${used.length === 1 ? "" : "s"}`),
    h("ul", {class: "plain"}, used.map((r) => h("li", {},
      h("code", {title: r.workload_key}, String(r.workload_key || "").slice(0, 12)),
      ` · ${shortHost(r.host)} · ${latency(r.mean_seconds)}`))));
}

function downloadButton(artifact, report) {
  return actionButton("Download", async () => {
    const saved = await download(`artifacts/${artifact.id}/download`, `artifact-${artifact.id}.tar`);
    return `Saved ${saved.filename} (${bytes(saved.size)}${saved.checked ? ", sha256 checked" : ""}).`;
  }, {report, ariaLabel: `Download artifact ${artifact.id}`});
}

/** The artifacts table; `report` shows what a download did. */
export function artifactTable(report, {caption = "Compiled artifacts, newest first", showModel = true} = {}) {
  return new Table([
    {key: "id", label: "ID", numeric: true},
    showModel ? {key: "model_name", label: "Model", cell: (a) => link(`#/models/${a.model_id}`, a.model_name)} : null,
    {key: "host", label: "Target / host", cell: (a) => h("span", {title: a.host}, `${a.target} · ${shortHost(a.host)}`)},
    {key: "state", label: "State", cell: (a) => h("span", {title: a.error_message || null}, badge(a.state))},
    {key: "size_bytes", label: "Size", numeric: true, cell: (a) => bytes(a.size_bytes)},
    {key: "sha256", label: "sha256", cell: (a) => (a.sha256 ? h("code", {class: "hash", title: a.sha256}, a.sha256) : "—")},
    {key: "records_used", label: "Records used", value: (a) => (a.records_used || []).length, cell: recordsUsed},
    {key: "created_at", label: "Created", cell: (a) => when(a.created_at)},
    {key: "download", label: "", sortable: false, cell: (a) => (a.state === "ready" ? downloadButton(a, report) :
      (a.error_message ? h("span", {class: "muted message", title: a.error_message}, a.error_message) : ""))},
  ].filter(Boolean), {caption, empty: "No artifacts yet: compile a model from its page.", sortable: true,
    rowKey: (a) => a.id});
}

export function render(root, view) {
  const report = h("div", {class: "report"});
  const status = h("div");
  const table = artifactTable(report);
  root.append(pageHeader("Artifacts"), report, section("Compiled artifacts", status, table.wrapper));
  live(view, POLL_MS, (signal) => get("artifacts", undefined, {signal}), (artifacts) => {
    replace(status);
    table.update(artifacts);
  }, (error) => replace(status, message(`Could not load the artifacts: ${errorText(error)}`, "error")));
}
