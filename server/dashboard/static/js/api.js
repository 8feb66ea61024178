// The REST API as the page uses it: every call sends the team token as `Authorization: Bearer`, errors come back
// as ApiError with the server's {detail, code}, and any 401 sends the user to the login page with that detail.

const TOKEN_KEY = "tilefarm.token";
const BASE = new URL("api/v1/", document.baseURI);

export class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail);
    this.status = status;
    this.code = code;
    this.detail = detail;
  }
}

export const token = () => localStorage.getItem(TOKEN_KEY);
export const saveToken = (value) => localStorage.setItem(TOKEN_KEY, value);
export const forgetToken = () => localStorage.removeItem(TOKEN_KEY);

let unauthorized = () => {};
/** What to do when the server refuses the token (set once by app.js: back to the login page). */
export function onUnauthorized(handler) {
  unauthorized = handler;
}

function url(path, query = {}) {
  const u = new URL(path, BASE);
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== "") u.searchParams.set(name, value);
  }
  return u;
}

async function errorOf(response) {
  let body = {};
  try {
    body = await response.json();
  } catch {
    // not JSON (a proxy's page): the status line says enough
  }
  const detail = typeof body.detail === "string" ? body.detail : `HTTP ${response.status} ${response.statusText}`;
  return new ApiError(response.status, body.code || "http_error", detail);
}

/**
 * fetch() an API path. `json` sends a JSON body, `form` a FormData; `raw` returns the Response itself.
 * `withToken` overrides the stored token (the login page checks a token before keeping it).
 */
export async function request(path, {method = "GET", query, json, form, signal, raw = false, withToken} = {}) {
  const headers = {};
  const bearer = withToken ?? token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  let body;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  } else if (form !== undefined) {
    body = form;
  }
  let response;
  try {
    response = await fetch(url(path, query), {method, headers, body, signal});
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "unreachable", `cannot reach the tilefarm server (${e.message})`);
  }
  if (!response.ok) {
    const error = await errorOf(response);
    if (response.status === 401 && withToken === undefined) unauthorized(error.detail);
    throw error;
  }
  if (raw) return response;
  return response.status === 204 ? null : response.json();
}

export const get = (path, query, options = {}) => request(path, {...options, query});
export const post = (path, json, options = {}) => request(path, {...options, method: "POST", json});

/**
 * The server-sent events URL of a job. EventSource cannot set headers, and a token in a URL would land in access
 * logs: the URL carries a ticket instead, asked for with the token, good for this job only and for a minute.
 */
export async function eventsUrl(jobId, after = 0, {signal} = {}) {
  const {ticket} = await request(`jobs/${jobId}/events/ticket`, {method: "POST", signal});
  return url(`jobs/${jobId}/events`, {ticket, after: after || undefined});
}

async function sha256Hex(blob) {
  const digest = await crypto.subtle.digest("SHA-256", await blob.arrayBuffer());
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

function filenameOf(response, fallback) {
  const disposition = response.headers.get("Content-Disposition") || "";
  const star = /filename\*=UTF-8''([^;]+)/i.exec(disposition);
  if (star) return decodeURIComponent(star[1]);
  const plain = /filename="?([^";]+)"?/i.exec(disposition);
  return plain ? plain[1] : fallback;
}

/**
 * Download an API file with the token (a plain link cannot send it): fetch, check X-Checksum-SHA256 where the
 * browser has SubtleCrypto, then save the blob under the server's file name. Returns {filename, size, checked}.
 */
export async function download(path, fallbackName, query) {
  const response = await request(path, {query, raw: true});
  const blob = await response.blob();
  const expected = response.headers.get("X-Checksum-SHA256");
  let checked = false;
  if (expected && globalThis.crypto && crypto.subtle) {
    const actual = await sha256Hex(blob);
    if (actual !== expected.toLowerCase()) {
      throw new ApiError(0, "checksum_mismatch", `the download's sha256 is ${actual}, the server said ${expected}`);
    }
    checked = true;
  }
  const filename = filenameOf(response, fallbackName);
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = filename;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
  return {filename, size: blob.size, checked};
}
