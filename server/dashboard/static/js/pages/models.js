// The team's models: the upload form (an ONNX file, optional name and input shapes), the list with their tasks,
// and the coverage heatmap: for every model and host class, how many of its tasks the records have tuned.

import {get, request} from "../api.js";
import {heatmap} from "../charts.js";
import {field, h, message, replace, section} from "../dom.js";
import {bytes, count, flops, shortHost, when} from "../format.js";
import {go} from "../router.js";
import {Table} from "../table.js";
import {errorText, fail, link, live, pageHeader, show, slot} from "../ui.js";

export const title = "Models";
const POLL_MS = 3000;

export const modelFlops = (m) => m.tasks.reduce((sum, t) => sum + (t.flops || 0) * t.weight, 0);

function uploadForm(onUploaded) {
  const file = h("input", {type: "file", name: "file", accept: ".onnx,application/octet-stream", required: true});
  const name = h("input", {type: "text", name: "name", placeholder: "the file's name"});
  const shapes = h("input", {type: "text", name: "input_shapes", placeholder: '{"input": [1, 3, 224, 224]}',
    spellcheck: "false"});
  const submit = h("button", {type: "submit"}, "Upload");
  const report = h("div", {class: "report"});
  const form = h("form", {class: "inline-form", "aria-label": "Upload a model"},
    field("ONNX model file", file), field("Name (optional)", name),
    field("Input shapes (optional)", shapes, "for inputs with dynamic dimensions"), submit, report);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!file.files.length) return;
    const body = new FormData();
    body.append("file", file.files[0]);
    if (name.value.trim()) body.append("name", name.value.trim());
    if (shapes.value.trim()) body.append("input_shapes", shapes.value.trim());
    submit.disabled = true;
    replace(report, message(`Uploading ${file.files[0].name}…`));
    try {
      const model = await request("models", {method: "POST", form: body});
      const what = model.duplicate ? "Already uploaded as" : "Uploaded";
      replace(report, h("p", {class: "msg msg-info", role: "status"},
        `${what} model ${model.id} (${model.tasks.length} tasks): `, link(`#/models/${model.id}`, model.name)));
      form.reset();
      onUploaded(model);
    } catch (error) {
      replace(report, message(`Upload failed: ${errorText(error)}`, "error"));
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

function coverageMap(coverage) {
  if (!coverage.models.length) return message("No models yet.");
  if (!coverage.hosts.length) return message("No host class has records or workers yet: start a worker.");
  const rows = coverage.models.map((m) => ({label: m.name, href: `#/models/${m.id}`, title: `model ${m.id}: ${m.name}`}));
  const columns = coverage.hosts.map((host) => ({label: shortHost(host.fingerprint),
    sublabel: `${(host.cpu_model || host.kind || "").slice(0, 24)}${host.alive_workers ? ` · ${host.alive_workers} up` : ""}`}));
  return heatmap(rows, columns, (i, j) => {
    const m = coverage.models[i], host = coverage.hosts[j];
    const tuned = m.tuned[j];
    const untuned = (m.task_tuned?.[j] || []).map((ok, position) => (ok ? null : position)).filter((p) => p !== null);
    return {
      fraction: m.tasks ? tuned / m.tasks : null,
      text: `${tuned} / ${m.tasks}`,
      title: `${m.name} on ${host.fingerprint}${host.cpu_model ? ` (${host.cpu_model})` : ""}: ${tuned} of ${m.tasks}` +
        ` tasks tuned${untuned.length ? `; untuned: ${untuned.join(", ")}` : ""}`,
    };
  }, {label: "Coverage: tuned tasks per model and host class"});
}

export function render(root, view) {
  const status = h("div");
  const table = new Table([
    {key: "id", label: "ID", numeric: true},
    {key: "name", label: "Name", cell: (m) => link(`#/models/${m.id}`, m.name)},
    {key: "tasks", label: "Tasks", numeric: true, value: (m) => m.tasks.length},
    {key: "flops", label: "FLOP", numeric: true, value: modelFlops, cell: (m) => flops(modelFlops(m))},
    {key: "size_bytes", label: "Size", numeric: true, cell: (m) => bytes(m.size_bytes)},
    {key: "sha256", label: "sha256", cell: (m) => h("code", {title: m.sha256}, m.sha256.slice(0, 12))},
    {key: "created_at", label: "Uploaded", cell: (m) => when(m.created_at)},
  ], {caption: "The team's models, newest first", empty: "No models yet: upload one above.", sortable: true,
    rowKey: (m) => m.id, onSelect: (m) => go(`/models/${m.id}`)});
  const coverage = slot("the coverage");
  let modelsPoll = null, coveragePoll = null;
  root.append(
    pageHeader("Models"),
    section("Upload a model", uploadForm(() => { modelsPoll.now(); coveragePoll.now(); })),
    section("Models", status, table.wrapper),
    section("Coverage", h("p", {class: "muted"}, "Tasks with at least one error-free record per host class " +
      "(target llvm). Hover a cell for the untuned tasks."), coverage),
  );
  modelsPoll = live(view, POLL_MS, (signal) => get("models", undefined, {signal}), (models) => {
    replace(status, models.length ? h("p", {class: "muted"}, `${count(models.length)} model${models.length === 1 ? "" : "s"}`)
      : null);
    table.update(models);
  }, (error) => replace(status, message(`Could not load the models: ${errorText(error)}`, "error")));
  coveragePoll = live(view, POLL_MS, (signal) => get("coverage", {target: "llvm"}, {signal}),
    (data) => show(coverage, coverageMap(data)), (error) => fail(coverage, "the coverage", error));
}
