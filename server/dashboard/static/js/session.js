// Who is signed in, and the message the login page shows when it is shown because a token was refused.

import {get} from "./api.js";

let notice = "";
let returnTo = "/jobs";

export function refuse(detail) {
  notice = `That token was not accepted: ${detail}`;
}

export function takeNotice() {
  const text = notice;
  notice = "";
  return text;
}

export function rememberReturn(path) {
  if (path && path !== "/login") returnTo = path;
}

export const returnPath = () => returnTo;

const listeners = [];
export function onSignedIn(fn) {
  listeners.push(fn);
}

/** Ask the server who the stored token belongs to, and tell the page header. */
export async function whoAmI() {
  const me = await get("me");
  for (const fn of listeners) fn(me);
  return me;
}
