//! demo.svg: per workload a pair of bars, plain TCP and pepd (completion time, or for the
//! fade row the requests' latency), with the speed-up written above each pair.

use std::path::Path;

use plotters::prelude::*;

use super::report::Report;

const PLAIN_COLOUR: RGBColor = RGBColor(0xc0, 0x39, 0x2b);
const PEPD_COLOUR: RGBColor = RGBColor(0x29, 0x80, 0xb9);
/// Width of one bar in workload slots (a pair takes twice this).
const BAR: f64 = 0.35;

/// plotters' errors borrow the backend's; flatten them to text at this edge.
fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e}")
}

pub fn draw(path: &Path, report: &Report) -> anyhow::Result<()> {
    let rows = &report.rows;
    let tallest = rows
        .iter()
        .flat_map(|r| [r.plain.median_s(), r.pepd.median_s()])
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    // Head room for the labels above the bars.
    let ymax = (tallest * 1.3).max(1.0);
    let root = SVGBackend::new(path, (960, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("pepd demo: {}", report.link_line()),
            ("sans-serif", 18),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..(rows.len() as f64 - 0.5), 0f64..ymax)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_labels(rows.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                rows.get(i as usize)
                    .map(|r| r.workload.clone())
                    .unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("completion time or request latency (s), lower is better")
        .draw()
        .map_err(plot_err)?;
    let series = [
        ("plain TCP (CUBIC)", PLAIN_COLOUR, -BAR),
        ("through pepd", PEPD_COLOUR, 0.0),
    ];
    for (name, colour, offset) in series {
        let bars = rows.iter().enumerate().map(move |(i, r)| {
            let v = if offset < 0.0 {
                r.plain.median_s()
            } else {
                r.pepd.median_s()
            };
            let x0 = i as f64 + offset;
            Rectangle::new([(x0, 0.0), (x0 + BAR, v)], colour.filled())
        });
        chart
            .draw_series(bars)
            .map_err(plot_err)?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    // Text hangs down from its anchor, so anchors sit well above what they label.
    let label_style = ("sans-serif", 13).into_font().color(&BLACK);
    let value_labels = rows.iter().enumerate().flat_map(|(i, r)| {
        [(-BAR, &r.plain), (0.0, &r.pepd)].map(|(offset, s)| {
            let v = s.median_s();
            let bound = if s.capped > 0 { ">" } else { "" };
            Text::new(
                format!("{bound}{v:.1} s"),
                (i as f64 + offset + 0.02, v + ymax * 0.04),
                label_style.clone(),
            )
        })
    });
    chart.draw_series(value_labels).map_err(plot_err)?;
    let speedups = rows.iter().enumerate().map(|(i, r)| {
        let top = r.plain.median_s().max(r.pepd.median_s());
        Text::new(
            format!("×{:.1}", r.speedup()),
            (i as f64 - BAR / 2.0, top + ymax * 0.11),
            ("sans-serif", 16).into_font().color(&BLACK),
        )
    });
    chart.draw_series(speedups).map_err(plot_err)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}
