// The login page: a token field, checked with GET /api/v1/me before it is kept in localStorage.

import {get, saveToken} from "../api.js";
import {field, h, message, replace} from "../dom.js";
import {go} from "../router.js";
import {refuse, returnPath, takeNotice, whoAmI} from "../session.js";
import {errorText} from "../ui.js";

export const title = "Sign in";

export function render(root) {
  const input = h("input", {type: "password", name: "token", autocomplete: "current-password", required: true,
    spellcheck: "false"});
  const report = h("div", {class: "report"});
  const notice = takeNotice();
  if (notice) replace(report, message(notice, "error"));
  const submit = h("button", {type: "submit"}, "Sign in");
  const form = h("form", {class: "login card", "aria-label": "Sign in"},
    h("h1", {}, "Sign in to tilefarm"),
    h("p", {}, "Paste your team's API token (", h("code", {}, "tilefarm serve"), " prints one; ",
      h("code", {}, "tilefarm remote token create"), " makes more). It stays in this browser only."),
    field("API token", input), submit, report);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const candidate = input.value.trim();
    if (!candidate) return;
    submit.disabled = true;
    replace(report, message("Checking the token…"));
    try {
      await get("me", undefined, {withToken: candidate});
      saveToken(candidate);
      await whoAmI();
      go(returnPath());
    } catch (error) {
      if (error.status === 401) {
        refuse(error.detail);
        replace(report, message(takeNotice(), "error"));
      } else {
        replace(report, message(`Could not check the token: ${errorText(error)}`, "error"));
      }
    } finally {
      submit.disabled = false;
    }
  });
  root.append(form);
  input.focus();
}
