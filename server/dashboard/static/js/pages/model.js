// One model: its tasks with the records' coverage on the default host class, the form that starts a tuning job,
// and compile, with this model's artifacts and their download buttons.

import {get, post} from "../api.js";
import {field, h, message, replace, section} from "../dom.js";
import {bytes, count, flops, latency, shortHost, weight, when} from "../format.js";
import {go} from "../router.js";
import {Table} from "../table.js";
import {actionButton, errorText, fail, live, pageHeader, show, slot} from "../ui.js";
import {artifactTable} from "./artifacts.js";
import {modelFlops} from "./models.js";

export const title = "Model";
const POLL_MS = 3000;

function facts(model) {
  const c = model.coverage;
  const rows = [
    ["Tasks", String(model.tasks.length)],
    ["FLOP", flops(modelFlops(model))],
    ["Size", bytes(model.size_bytes)],
    ["sha256", h("code", {class: "hash"}, model.sha256)],
    ["Input shapes", model.input_shapes ? JSON.stringify(model.input_shapes) : "from the file"],
    ["Uploaded", when(model.created_at)],
  ];
  if (c) {
    const measured = c.tasks.filter((t) => t.records > 0).length;
    rows.push(["Coverage", h("span", {title: c.host},
      `on ${shortHost(c.host)} (${c.target}): ${measured} of ${model.tasks.length} tasks have records, ` +
      `${c.tuned_tasks} their full per-task budget; ${count(c.trials_needed)} more trials would complete it`)]);
  }
  return h("dl", {class: "facts"}, rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

function taskRows(model) {
  const coverage = new Map((model.coverage?.tasks || []).map((t) => [t.position, t]));
  return model.tasks.map((t) => ({...t, ...(coverage.get(t.position) || {})}));
}

function jobForm(modelId) {
  const trials = h("input", {type: "number", name: "trials", min: 1, value: 64, required: true});
  const perRound = h("input", {type: "number", name: "per_round", min: 1, max: 4096, value: 16, required: true});
  const budget = h("input", {type: "number", name: "time_budget_s", min: 1, step: "any", placeholder: "none"});
  const seed = h("input", {type: "number", name: "seed", min: 0, value: 0});
  const submit = h("button", {type: "submit"}, "Start tuning");
  const report = h("div", {class: "report"});
  const form = h("form", {class: "inline-form", "aria-label": "Start a tuning job"},
    field("Trials", trials), field("Per round", perRound), field("Time budget (s)", budget), field("Seed", seed),
    submit, report);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    submit.disabled = true;
    try {
      const body = {model_id: modelId, trials: Number(trials.value), per_round: Number(perRound.value),
        seed: Number(seed.value || 0)};
      if (budget.value) body.time_budget_s = Number(budget.value);
      const job = await post("jobs", body);
      go(`/jobs/${job.id}`);
    } catch (error) {
      replace(report, message(`Could not start the job: ${errorText(error)}`, "error"));
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

export function render(root, view, id) {
  const modelId = Number(id);
  const heading = h("h1", {}, `Model ${modelId}`);
  const about = slot("the model");
  const tasksSlot = slot("the tasks");
  const report = h("div", {class: "report"});
  const tasks = new Table([
    {key: "position", label: "ID", numeric: true},
    {key: "name", label: "Name"},
    {key: "workload_key", label: "Workload", cell: (t) => h("code", {title: t.workload_key}, t.workload_key.slice(0, 12))},
    {key: "weight", label: "Weight", numeric: true, cell: (t) => weight(t.weight)},
    {key: "flops", label: "FLOP", numeric: true, cell: (t) => flops(t.flops)},
    {key: "records", label: "Records", numeric: true},
    {key: "best_latency_s", label: "Best latency", numeric: true, cell: (t) => latency(t.best_latency_s)},
    {key: "trials_needed", label: "Trials needed", numeric: true},
  ], {caption: "Tasks (coverage on the default host class)", sortable: true, rowKey: (t) => t.position});
  const artifacts = artifactTable(report, {caption: "Artifacts of this model", showModel: false});
  const artifactsStatus = h("div");
  let artifactsPoll = null;
  const compile = actionButton("Compile", async () => {
    const artifact = await post(`models/${modelId}/compile`, {target: "llvm"});
    artifactsPoll.now();
    return `Artifact ${artifact.id} is ${artifact.state}: a worker builds it with the best records.`;
  }, {report, ariaLabel: "Compile this model"});

  root.append(h("div", {class: "page-header"}, heading), about,
    section("Tasks", tasksSlot),
    section("Start a tuning job", jobForm(modelId)),
    section("Compile", h("p", {}, compile, " builds an artifact with the records' best schedules for the host class."),
      report, artifactsStatus, artifacts.wrapper));

  live(view, POLL_MS, (signal) => get(`models/${modelId}`, undefined, {signal}), (model) => {
    heading.textContent = `Model ${model.id}: ${model.name}`;
    document.title = `${model.name} · tilefarm`;
    show(about, facts(model));
    tasks.update(taskRows(model));
    if (!tasksSlot.contains(tasks.wrapper)) show(tasksSlot, tasks.wrapper);
  }, (error) => {
    fail(about, error.status === 404 ? "this model" : "the model", error);
    fail(tasksSlot, "the tasks", error);
  });
  artifactsPoll = live(view, POLL_MS, (signal) => get("artifacts", undefined, {signal}), (all) => {
    replace(artifactsStatus);
    artifacts.update(all.filter((a) => a.model_id === modelId));
  }, (error) => replace(artifactsStatus, message(`Could not load the artifacts: ${errorText(error)}`, "error")));
}
