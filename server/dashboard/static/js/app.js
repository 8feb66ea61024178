// The dashboard's entry point: the route table, the header (team, log out), and what a refused token does.

import {forgetToken, onUnauthorized, token} from "./api.js";
import * as artifacts from "./pages/artifacts.js";
import * as job from "./pages/job.js";
import * as jobs from "./pages/jobs.js";
import * as login from "./pages/login.js";
import * as model from "./pages/model.js";
import * as models from "./pages/models.js";
import * as records from "./pages/records.js";
import * as workers from "./pages/workers.js";
import {go, startRouter} from "./router.js";
import {onSignedIn, refuse, rememberReturn, whoAmI} from "./session.js";

const ROUTES = [
  [/^\/login$/, login],
  [/^\/jobs$/, jobs],
  [/^\/jobs\/(\d+)$/, job],
  [/^\/models$/, models],
  [/^\/models\/(\d+)$/, model],
  [/^\/records$/, records],
  [/^\/workers$/, workers],
  [/^\/artifacts$/, artifacts],
];

const nav = document.getElementById("nav");
const who = document.getElementById("who");
const team = document.getElementById("team");

function signedOut() {
  nav.hidden = true;
  who.hidden = true;
  team.textContent = "";
}

onSignedIn((me) => {
  team.textContent = `team ${me.team} · token ${me.token.name}`;
  nav.hidden = false;
  who.hidden = false;
});

// any 401 (a wrong, revoked or deleted token): forget it, back to the login page with the server's reason
onUnauthorized((detail) => {
  if (!token()) return; // refused already: the first 401 of a page's parallel calls did it
  forgetToken();
  refuse(detail);
  signedOut();
  go("/login");
});

document.getElementById("logout").addEventListener("click", () => {
  forgetToken();
  signedOut();
  go("/login");
});

function markCurrent(path) {
  for (const a of nav.querySelectorAll("a")) {
    const here = path === a.hash.slice(1) || path.startsWith(`${a.hash.slice(1)}/`);
    if (here) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

startRouter(ROUTES, document.getElementById("main"), {
  fallback: "/jobs",
  guard(path) {
    if (path !== "/login" && !token()) {
      rememberReturn(path);
      signedOut();
      return "/login";
    }
    return null;
  },
  afterRender: markCurrent,
});

if (token()) whoAmI().catch(() => {}); // a 401 goes to the login page through onUnauthorized
