// Hash routes (#/jobs, #/jobs/12, ...) and the life of the page on screen: each route renders into <main> with a
// View that owns its timers, event streams and fetches, and closes them all on navigation, so only the visible page
// polls and a slow answer from the page left behind never draws over the new one.

export class View {
  constructor() {
    this.controller = new AbortController();
    this.closers = [];
  }

  get signal() {
    return this.controller.signal;
  }

  get open() {
    return !this.controller.signal.aborted;
  }

  /** Run `fn` now and then `ms` after each run ends (runs never overlap), until the view closes; a browser tab in
   * the background skips its turns. */
  every(ms, fn) {
    let timer = null;
    const tick = async () => {
      timer = null;
      if (!this.open) return;
      try {
        if (!document.hidden) await fn();
      } catch (e) {
        if (e.name !== "AbortError") console.error(e);
      }
      if (this.open) timer = setTimeout(tick, ms);
    };
    this.onClose(() => timer && clearTimeout(timer));
    tick();
    return {now: () => { if (timer) { clearTimeout(timer); tick(); } }};
  }

  onClose(fn) {
    this.closers.push(fn);
  }

  close() {
    this.controller.abort();
    for (const fn of this.closers.splice(0)) fn();
  }
}

/**
 * Render the page of the current hash into `outlet`. `routes`: [[RegExp, page]], a page being {title, render(root,
 * view, ...groups)}; `guard(path)` may answer another path to go to instead (the login page without a token).
 */
export function startRouter(routes, outlet, {fallback, guard, afterRender}) {
  let view = null;
  const show = () => {
    const path = location.hash.replace(/^#/, "") || fallback;
    const redirect = guard(path);
    if (redirect && redirect !== path) {
      location.hash = `#${redirect}`;
      return;
    }
    view?.close();
    view = new View();
    const match = routes.map(([pattern, page]) => [page, pattern.exec(path)]).find(([, m]) => m);
    outlet.replaceChildren();
    const [page, groups] = match || [null, null];
    if (!page) {
      location.hash = `#${fallback}`;
      return;
    }
    document.title = `${page.title} · tilefarm`;
    page.render(outlet, view, ...groups.slice(1));
    afterRender?.(path);
  };
  addEventListener("hashchange", show);
  show();
  return {refresh: show};
}

export function go(path) {
  if (location.hash === `#${path}`) dispatchEvent(new HashChangeEvent("hashchange"));
  else location.hash = `#${path}`;
}
