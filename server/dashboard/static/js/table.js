// Tables: columns described once, sortable by clicking their header (aria-sort says how), rows optionally
// selectable (click or Enter), updated in place so a live table keeps its sort order and selection.

import {DASH} from "./format.js";
import {h, replace} from "./dom.js";

const missing = (x) => x === null || x === undefined;

function compare(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), undefined, {numeric: true});
}

/**
 * columns: [{key, label, value(row) (what sorts; default row[key]), cell(row) (node or text; default value),
 * numeric}]. options: caption, empty (text when no rows), sortable, sort: {key, descending}, rowKey(row),
 * onSelect(row) (makes rows selectable), rowClass(row).
 */
export class Table {
  constructor(columns, {caption, empty = "Nothing yet.", sortable = false, sort = null, rowKey, onSelect, rowClass} = {}) {
    this.columns = columns;
    this.options = {empty, sortable, rowKey, onSelect, rowClass};
    this.sort = sort;
    this.selected = null;
    this.rows = [];
    this.head = h("thead");
    this.body = h("tbody");
    this.element = h("table", {class: onSelect ? "data selectable" : "data"}, caption ? h("caption", {}, caption) : null,
      this.head, this.body);
    this.wrapper = h("div", {class: "table-wrap"}, this.element);
    this.renderHead();
  }

  value(column, row) {
    return column.value ? column.value(row) : row[column.key];
  }

  renderHead() {
    const cells = this.columns.map((column) => {
      const attrs = {scope: "col", class: column.numeric ? "num" : null};
      if (!this.options.sortable || column.sortable === false) return h("th", attrs, column.label);
      const active = this.sort && this.sort.key === column.key;
      attrs["aria-sort"] = active ? (this.sort.descending ? "descending" : "ascending") : "none";
      const arrow = active ? (this.sort.descending ? " ▼" : " ▲") : "";
      return h("th", attrs, h("button", {type: "button", class: "sort", onclick: () => this.sortBy(column.key)},
        column.label, arrow));
    });
    replace(this.head, h("tr", {}, cells));
  }

  sortBy(key) {
    const descending = this.sort && this.sort.key === key ? !this.sort.descending : false;
    this.sort = {key, descending};
    this.renderHead();
    this.renderBody();
  }

  select(key) {
    this.selected = key;
    for (const tr of this.body.children) tr.setAttribute("aria-selected", String(tr.dataset.key === String(key)));
  }

  update(rows) {
    this.rows = rows;
    this.renderBody();
  }

  sorted() {
    if (!this.sort) return this.rows;
    const column = this.columns.find((c) => c.key === this.sort.key);
    const sign = this.sort.descending ? -1 : 1;
    return [...this.rows].sort((a, b) => {
      const va = this.value(column, a), vb = this.value(column, b);
      // missing values last, whichever the direction
      return (missing(va) - missing(vb)) || (missing(va) ? 0 : sign * compare(va, vb));
    });
  }

  renderBody() {
    if (!this.rows.length) {
      replace(this.body, h("tr", {class: "empty"}, h("td", {colspan: this.columns.length}, this.options.empty)));
      return;
    }
    const {rowKey, onSelect, rowClass} = this.options;
    replace(this.body, this.sorted().map((row) => {
      const key = rowKey ? String(rowKey(row)) : undefined;
      const attrs = {class: rowClass ? rowClass(row) : null, dataset: key === undefined ? undefined : {key}};
      if (onSelect) {
        Object.assign(attrs, {
          tabindex: 0,
          "aria-selected": String(key === String(this.selected)),
          onclick: (event) => {
            if (event.target.closest("a, button, summary")) return;
            this.select(key);
            onSelect(row);
          },
          onkeydown: (event) => {
            if (event.key === "Enter" && event.target === event.currentTarget) {
              this.select(key);
              onSelect(row);
            }
          },
        });
      }
      return h("tr", attrs, this.columns.map((column) => {
        const content = column.cell ? column.cell(row) : this.value(column, row);
        return h("td", {class: column.numeric ? "num" : null}, content ?? DASH);
      }));
    }));
  }
}

/** Previous / next over a server-paged list: "51–100 of 20,000". */
export class Pager {
  constructor(pageSize, onChange, label = "Pages") {
    this.pageSize = pageSize;
    this.offset = 0;
    this.total = 0;
    this.onChange = onChange;
    this.status = h("span", {class: "pager-status", "aria-live": "polite"});
    this.previous = h("button", {type: "button", onclick: () => this.move(-1)}, "Previous");
    this.next = h("button", {type: "button", onclick: () => this.move(1)}, "Next");
    this.element = h("nav", {class: "pager", "aria-label": label}, this.previous, this.status, this.next);
    this.update(0);
  }

  move(direction) {
    const offset = this.offset + direction * this.pageSize;
    if (offset < 0 || offset >= this.total) return;
    this.offset = offset;
    this.onChange(offset);
  }

  reset() {
    this.offset = 0;
  }

  update(total) {
    this.total = total;
    const first = total ? this.offset + 1 : 0;
    const last = Math.min(total, this.offset + this.pageSize);
    this.status.textContent = `${first.toLocaleString("en-US")}–${last.toLocaleString("en-US")} of ${
      total.toLocaleString("en-US")}`;
    this.previous.disabled = this.offset <= 0;
    this.next.disabled = last >= total;
  }
}
