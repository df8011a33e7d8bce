//! Aligned text tables and human-readable numbers.

/// A table printed with aligned columns: numbers right-aligned, text left.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table { headers: headers.iter().map(|h| h.to_string()).collect(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, no trailing spaces.
    pub fn render(&self) -> String {
        let n = self.headers.len();
        let width = |i: usize| {
            self.rows.iter().map(|r| r.get(i).map_or(0, |c| c.chars().count())).chain([self.headers[i].chars().count()]).max().unwrap_or(0)
        };
        let widths: Vec<usize> = (0..n).map(width).collect();
        // A column is numeric if every non-empty cell starts with a digit or '-'.
        let numeric: Vec<bool> = (0..n)
            .map(|i| {
                let cells: Vec<&String> = self.rows.iter().filter_map(|r| r.get(i)).filter(|c| !c.is_empty() && *c != "-").collect();
                !cells.is_empty() && cells.iter().all(|c| c.starts_with(|ch: char| ch.is_ascii_digit()))
            })
            .collect();
        let line = |cells: &[String]| {
            let mut out = String::new();
            for i in 0..n {
                let cell = cells.get(i).map_or("", String::as_str);
                let pad = widths[i].saturating_sub(cell.chars().count());
                if i > 0 {
                    out.push_str("  ");
                }
                if numeric[i] {
                    out.push_str(&" ".repeat(pad));
                    out.push_str(cell);
                } else {
                    out.push_str(cell);
                    out.push_str(&" ".repeat(pad));
                }
            }
            out.trim_end().to_string()
        };
        let mut out = line(&self.headers);
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// `1234567` as `1,234,567`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in B, KiB, MiB, GiB, TiB.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Seconds as `850 ms`, `12.3 s`, `4m 05s`, `2h 03m`, `3d 04h`.
pub fn age(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        format!("{}m {:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else if s < 86400.0 {
        format!("{}h {:02}m", (s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64)
    } else {
        format!("{}d {:02}h", (s / 86400.0) as u64, ((s % 86400.0) / 3600.0) as u64)
    }
}

/// At most `max` characters of `s`, with `…` when cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(max.saturating_sub(1)).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_humanised() {
        assert_eq!(count(0), "0");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(5 << 30), "5.0 GiB");
        assert_eq!(age(0.25), "250 ms");
        assert_eq!(age(125.0), "2m 05s");
        assert_eq!(cut("abcdef", 4), "abc…");
    }

    #[test]
    fn columns_align_numbers_right_and_text_left() {
        let mut t = Table::new(&["NAME", "N"]);
        t.row(vec!["a".into(), "1".into()]);
        t.row(vec!["long".into(), "1,000".into()]);
        assert_eq!(t.render(), "NAME      N\na         1\nlong  1,000\n");
    }
}
