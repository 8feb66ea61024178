// Numbers as people read them: latencies in s/ms/µs, FLOP counts with SI prefixes, durations, relative times.

export const DASH = "—";

function fixed(x, digits = 3) {
  return Number(x.toPrecision(digits)).toString();
}

/** 0.000123 -> "123 µs"; null -> "—". */
export function latency(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return DASH;
  const abs = Math.abs(seconds);
  if (abs >= 1) return `${fixed(seconds)} s`;
  if (abs >= 1e-3) return `${fixed(seconds * 1e3)} ms`;
  if (abs >= 1e-6 || abs === 0) return `${fixed(seconds * 1e6)} µs`;
  return `${fixed(seconds * 1e9)} ns`;
}

function si(value, unit) {
  if (value === null || value === undefined || !Number.isFinite(value)) return DASH;
  const prefixes = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [scale, prefix] of prefixes) {
    if (Math.abs(value) >= scale) return `${fixed(value / scale)} ${prefix}${unit}`;
  }
  return `${fixed(value)} ${unit}`;
}

export const flops = (n) => si(n, "FLOP");
export const bytes = (n) => si(n, "B");

/** GFLOP/s with one decimal. */
export function gflops(x) {
  return x === null || x === undefined || !Number.isFinite(x) ? DASH : x.toFixed(1);
}

/** 83.2 -> "1 min 23 s"; 0.25 -> "0.3 s"; 120 -> "2 min". */
export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return DASH;
  if (seconds < 10) return `${Number(seconds.toFixed(1))} s`;
  if (seconds < 60) return `${Math.round(seconds)} s`;
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), rest = s % 60;
  if (h) return m ? `${h} h ${m} min` : `${h} h`;
  return rest ? `${m} min ${rest} s` : `${m} min`;
}

/** An ISO time as "12 s ago" / "3 min ago" relative to now. */
export function ago(iso, now = Date.now()) {
  if (!iso) return DASH;
  const seconds = Math.max(0, (now - Date.parse(iso)) / 1000);
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

/** An ISO time in the browser's locale. */
export function when(iso) {
  return iso ? new Date(iso).toLocaleString() : DASH;
}

/** A host fingerprint is a long hash: its first 8 characters tell hosts apart on screen. */
export function shortHost(fingerprint) {
  return fingerprint ? String(fingerprint).slice(0, 8) : DASH;
}

/** What a target string runs on: "GPU" for cuda ("cuda -arch=sm_90"), "CPU" for llvm (the API's target_kind). */
export function targetKind(job) {
  const kind = job.target_kind || (String(job.target || "").split(/\s+/)[0].toLowerCase() === "cuda" ? "gpu" : "cpu");
  return kind.toUpperCase();
}

/** A GPU worker's GPU in a line: name, SMs, compute capability, memory ("NVIDIA H200 · 132 SMs · CC 9.0 · 140 GiB"). */
export function gpuLine(gpu) {
  if (!gpu) return DASH;
  const gib = Math.round(gpu.memory_bytes / 2 ** 30);
  return `${gpu.name} · ${gpu.sm_count} SMs · CC ${gpu.compute_capability} · ${gib} GiB`;
}

export function count(n) {
  return n === null || n === undefined ? DASH : Number(n).toLocaleString("en-US");
}

/** A task's weight: the times the model calls it. 0 marks a conv form it does not take (tuned so that compile can
 * take whichever form is faster: a model's other forms until then, and in a job whichever lost). */
export function weight(n) {
  return n === 0 ? "0 (form not taken)" : count(n);
}
