// Building the page without HTML strings: every server string becomes a text node or an attribute value, never
// markup, so nothing the API returns can inject elements or scripts.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(element.dataset, value);
    } else if (name === "value" && "value" in element) {
      element.value = value;
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(element, children);
  return element;
}

/** Append children: nodes as they are, strings and numbers as text, arrays flattened, null/false skipped. */
export function append(element, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/** h("a", {href: "#/jobs"}, "Jobs") — an HTML element. */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** svg("rect", {x: 0, ...}) — an SVG element. */
export function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** Replace an element's children. */
export function replace(element, ...children) {
  element.replaceChildren();
  return append(element, children);
}

/** A section with a heading, labelled by it (tests and screen readers find it by its name). */
export function section(title, ...children) {
  const id = `s-${title.toLowerCase().replace(/[^a-z0-9]+/g, "-")}`;
  return h("section", {class: "card", "aria-labelledby": id}, h("h2", {id}, title), ...children);
}

/** A message line: role=alert for errors, role=status otherwise. */
export function message(text, kind = "info") {
  return h("p", {class: `msg msg-${kind}`, role: kind === "error" ? "alert" : "status"}, text);
}

/** A labelled form control: <label>text <input …></label>. */
export function field(label, control, hint) {
  return h("label", {class: "field"}, h("span", {}, label), control, hint ? h("small", {}, hint) : null);
}
