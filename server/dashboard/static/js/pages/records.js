// The records every team shares, by workload: op tag, shapes, FLOP, how many records, the best latency per host
// class; a click prints the workload's best schedule as a loop nest. Export saves them all as JSON lines.
// An imported record is "unverified" until a farm worker of its host class has measured it (server/trust.py): its
// timing is the importer's claim, and only the importing team's compiles use it. The host lists count them, and a
// best that is one (the team's own import) is marked so.

import {download, get} from "../api.js";
import {field, h, message, replace, section} from "../dom.js";
import {count, flops, latency, shortHost} from "../format.js";
import {Pager, Table} from "../table.js";
import {actionButton, badge, errorText, fail, pageHeader, show, slot} from "../ui.js";

export const title = "Records";
const POLL_MS = 3000;
const PAGE = 50;
const SEARCH_DELAY_MS = 250;

/** {"inputs": [[1, 3, 32, 32], [8, 3, 3, 3]], "outputs": [[1, 8, 30, 30]]} -> "1×3×32×32, 8×3×3×3 → 1×8×30×30". */
function shapesText(shapes) {
  const list = (xs) => (Array.isArray(xs) ? xs.map((s) => (Array.isArray(s) ? s.join("×") : String(s))).join(", ") : "");
  if (shapes && typeof shapes === "object" && !Array.isArray(shapes)) {
    const inputs = list(shapes.inputs), outputs = list(shapes.outputs);
    return outputs ? `${inputs} → ${outputs}` : inputs || JSON.stringify(shapes);
  }
  return shapes === null || shapes === undefined ? "—" : list(shapes) || String(shapes);
}

/** The host whose best record is fastest. */
function fastest(workload) {
  const timed = workload.hosts.filter((x) => x.best_record_id !== null && x.best_latency_s !== null);
  return timed.sort((a, b) => a.best_latency_s - b.best_latency_s)[0] || null;
}

/** "unverified": an imported record (or records) whose timing the farm has not measured yet. */
function unverifiedBadge(title) {
  return h("span", {title}, badge("unverified"));
}

function hostsCell(workload, choose) {
  return h("ul", {class: "plain hosts"}, workload.hosts.map((x) => h("li", {},
    h("span", {title: x.host}, shortHost(x.host)), `: ${count(x.records)} records`,
    x.unverified ? h("span", {class: "muted", title: "imported records the farm has not measured yet: their " +
      "timings are claims, used only by the team that imported them"}, ` (${count(x.unverified)} unverified)`) : null,
    `, best ${latency(x.best_latency_s)} `,
    x.best_verified === false ? unverifiedBadge("your team's import, not measured by the farm yet") : null,
    x.best_record_id !== null && x.best_record_id !== undefined
      ? h("button", {type: "button", class: "small", "aria-label": `Schedule of ${workload.op_tag} on ${shortHost(x.host)}`,
        onclick: () => choose(workload, x)}, "schedule")
      : null)));
}

function scheduleView(workload, host, schedule) {
  return [
    h("h3", {}, `${schedule.op_tag || workload.op_tag}: record ${schedule.record_id}`),
    h("dl", {class: "facts"},
      h("dt", {}, "Workload"), h("dd", {}, h("code", {}, schedule.workload_key)),
      h("dt", {}, "Host"), h("dd", {title: schedule.host}, shortHost(schedule.host)),
      h("dt", {}, "Latency"), h("dd", {}, latency(schedule.mean_cost)),
      h("dt", {}, "Measured by"), h("dd", {}, schedule.verified ? "the farm"
        : [unverifiedBadge("the importer's claim"), " imported, not measured by the farm yet"]),
      h("dt", {}, "Steps"), h("dd", {}, String(schedule.steps.length))),
    h("pre", {class: "loop-nest", "aria-label": "Loop nest"}, schedule.loop_nest),
  ];
}

export function render(root, view) {
  const search = h("input", {type: "search", name: "q", placeholder: "op tag or workload key", autocomplete: "off"});
  const order = h("select", {name: "order"}, [["-records", "Most records"], ["records", "Fewest records"],
    ["-flops", "Most FLOP"], ["flops", "Fewest FLOP"]].map(([value, label]) => h("option", {value}, label)));
  const bestOnly = h("input", {type: "checkbox", name: "best_only"});
  const report = h("div", {class: "report"});
  const exportButton = actionButton("Export records", async () => {
    const saved = await download("records/export", "records.jsonl", {best_only: bestOnly.checked ? "true" : undefined});
    return `Saved ${saved.filename} (${count(saved.size)} bytes).`;
  }, {report});
  const body = slot("the workloads");
  const schedule = h("div", {class: "schedule", "aria-live": "polite"},
    h("p", {class: "muted"}, "Click a workload to print its best schedule as a loop nest."));
  let shown = "", chosen = 0;

  async function choose(workload, host) {
    const mine = ++chosen; // the last click wins
    if (!host) {
      replace(schedule, message(`No error-free record of ${workload.op_tag} yet: nothing to print.`));
      return;
    }
    schedule.setAttribute("aria-busy", "true");
    replace(schedule, message(`Replaying record ${host.best_record_id}…`));
    try {
      const data = await get(`records/${host.best_record_id}/schedule`, undefined, {signal: view.signal});
      if (mine === chosen) show(schedule, ...scheduleView(workload, host, data));
    } catch (error) {
      if (error.name !== "AbortError" && mine === chosen) fail(schedule, `the schedule of record ${host.best_record_id}`, error);
    }
  }

  const table = new Table([
    {key: "op_tag", label: "Op", cell: (w) => h("span", {title: w.key}, w.op_tag || w.key.slice(0, 12))},
    {key: "shapes", label: "Shapes", value: (w) => shapesText(w.shapes)},
    {key: "flops", label: "FLOP", numeric: true, cell: (w) => flops(w.flops)},
    {key: "records", label: "Records", numeric: true, cell: (w) => count(w.records)},
    {key: "hosts", label: "Best per host", value: (w) => fastest(w)?.best_latency_s ?? null,
      cell: (w) => hostsCell(w, choose)},
  ], {caption: "Workloads (click one for its best schedule)", empty: "No workload matches.", rowKey: (w) => w.key,
    onSelect: (w) => choose(w, fastest(w))});
  const pager = new Pager(PAGE, () => load(), "Workload pages");

  let asked = 0;
  async function load() {
    const query = {offset: pager.offset, limit: PAGE, q: search.value.trim(), order: order.value};
    const mine = ++asked; // a slower answer to an older query (a refresh, the last search) must not win
    try {
      const page = await get("records/workloads", query, {signal: view.signal});
      if (mine !== asked) return;
      const text = JSON.stringify(page);
      if (text === shown) return;
      shown = text;
      table.update(page.workloads);
      pager.update(page.total);
      if (!body.contains(table.wrapper)) show(body, table.wrapper, pager.element);
    } catch (error) {
      if (error.name === "AbortError" || mine !== asked) return;
      shown = "";
      fail(body, "the workloads", error);
    }
  }

  let typing = null;
  const refilter = () => {
    pager.reset();
    load();
  };
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(refilter, SEARCH_DELAY_MS);
  });
  order.addEventListener("change", refilter);
  view.onClose(() => clearTimeout(typing));

  root.append(
    pageHeader("Records"),
    section("Workloads", h("div", {class: "filters"}, field("Search workloads", search), field("Order", order)), body),
    section("Best schedule", schedule),
    section("Export", h("p", {}, "Every record as the JSON lines ", h("code", {}, "tilefarm records import"),
      " reads."), h("div", {class: "filters"}, h("label", {class: "check"}, bestOnly,
      " Only the fastest record per workload, target and host"), exportButton), report),
  );
  view.every(POLL_MS, load);
}
