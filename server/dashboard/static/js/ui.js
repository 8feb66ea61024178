// Pieces every page uses: state badges, sections that say "loading" until their data comes and say why when it
// does not, live data that redraws only when it changed, and buttons that run one API call at a time.

import {h, message, replace} from "./dom.js";

export function errorText(error) {
  if (error && error.status) return `${error.detail} (HTTP ${error.status})`;
  return error && error.message ? error.message : String(error);
}

/** A state badge: queued, running, succeeded, failed, cancelled, ready, alive, lost, stopped, ... */
export function badge(state) {
  return h("span", {class: `badge state-${state}`}, state);
}

/** A container that shows `Loading …` (aria-busy) until `show` or `fail` fills it. */
export function slot(what, attrs = {}) {
  return h("div", {class: "slot", "aria-busy": "true", ...attrs}, message(`Loading ${what}…`));
}

export function show(container, ...children) {
  container.setAttribute("aria-busy", "false");
  return replace(container, ...children);
}

export function fail(container, what, error) {
  container.setAttribute("aria-busy", "false");
  return replace(container, message(`Could not load ${what}: ${errorText(error)}`, "error"));
}

/**
 * Poll `load(signal)` every `ms` while the view is open; call `render(data)` when the answer differs from the last
 * (so a live table keeps its scroll, sort and open rows when nothing changed), `onError(error)` when it fails.
 * Returns the View.every handle ({now()} polls at once, after an action).
 */
export function live(view, ms, load, render, onError) {
  let last = null;
  return view.every(ms, async () => {
    try {
      const data = await load(view.signal);
      if (!view.open) return;
      const text = JSON.stringify(data);
      if (text !== last) {
        last = text;
        render(data);
      }
    } catch (error) {
      if (error.name === "AbortError" || !view.open) return;
      last = null;
      onError(error);
    }
  });
}

/** A button that runs `action()` (an API call), disabled meanwhile; its error or result goes to `report`. */
export function actionButton(label, action, {report, ariaLabel, kind = ""} = {}) {
  const button = h("button", {type: "button", class: kind, "aria-label": ariaLabel}, label);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const text = await action();
      if (report && text) replace(report, message(text));
    } catch (error) {
      if (report) replace(report, message(errorText(error), "error"));
      else console.error(error);
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

export function pageHeader(title, ...extra) {
  return h("div", {class: "page-header"}, h("h1", {}, title), ...extra);
}

export function link(href, text) {
  return h("a", {href}, text);
}
