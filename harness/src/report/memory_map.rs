//! A memory map over time, downsampled: a raster of time buckets (event
//! index) by address buckets, each cell holding the fraction of its
//! byte-columns that live blocks covered. Drawing one rectangle per cell run
//! keeps the report small however long the trace is.

use crate::replay::Placement;

/// Occupancy raster; `cells[row][column]` is in 0..=1, row 0 at address 0.
#[derive(Debug, Clone)]
pub struct Raster {
    /// Time buckets.
    pub columns: usize,
    /// Address buckets.
    pub rows: usize,
    /// Bytes per row.
    pub bytes_per_row: f64,
    /// Occupancy, row-major.
    pub cells: Vec<Vec<f64>>,
}

impl Raster {
    /// Rasterize `placement` of a trace whose blocks'
    /// lifetimes (`(alloc event, free event)` by id) and sizes are given,
    /// over addresses `0..address_span` bytes of `bands`; `column_of`
    /// says where an event lies, in columns (fractional): columns are
    /// even stretches of the map's x axis, time or events.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        placement: &Placement,
        bands: &AddressBands,
        column_of: &dyn Fn(usize) -> f64,
        lifetimes: &[(usize, usize)],
        sizes: &[u64],
        address_span: u64,
        columns: usize,
        rows: usize,
    ) -> Self {
        let bytes_per_row = (address_span.max(1) as f64) / rows as f64;
        let mut raster = Raster {
            columns,
            rows,
            bytes_per_row,
            cells: vec![vec![0.0; columns]; rows],
        };
        // Coverage of whole columns goes through a difference array per row,
        // so a block alive for the whole trace costs O(rows), not O(cells).
        let mut spans = vec![vec![0.0f64; columns + 1]; rows];

        let mut moves = placement.moves.clone();
        moves.sort_by_key(|&(event, id, _)| (id, event));
        let mut next_move = 0;
        for (id, &(born, died)) in lifetimes.iter().enumerate() {
            let mut offset = placement.offsets[id];
            if offset == u64::MAX {
                continue;
            }
            offset = bands.map(offset);
            let mut from = born;
            while next_move < moves.len() && (moves[next_move].1 as usize) < id {
                next_move += 1;
            }
            while next_move < moves.len() && moves[next_move].1 as usize == id {
                let (event, _, to) = moves[next_move];
                // The move happened during event `event`: the block sat at
                // the old offset before it.
                let until = event.min(died);
                raster.cover(&mut spans, column_of, from, until, offset, sizes[id]);
                from = until;
                offset = bands.map(to);
                next_move += 1;
            }
            raster.cover(&mut spans, column_of, from, died, offset, sizes[id]);
        }
        for (row, span) in raster.cells.iter_mut().zip(&spans) {
            let mut running = 0.0;
            for (cell, delta) in row.iter_mut().zip(span) {
                running += delta;
                *cell += running;
            }
        }
        for cell in raster.cells.iter_mut().flatten() {
            *cell = (*cell / bytes_per_row).clamp(0.0, 1.0);
        }
        raster
    }

    /// Add a block of `size` bytes at `offset`, alive over events
    /// `from..until`, in byte-columns.
    fn cover(
        &mut self,
        spans: &mut [Vec<f64>],
        column_of: &dyn Fn(usize) -> f64,
        from: usize,
        until: usize,
        offset: u64,
        size: u64,
    ) {
        if until <= from || size == 0 {
            return;
        }
        let x0 = column_of(from);
        let x1 = column_of(until);
        if x1 <= x0 {
            return;
        }
        let first_column = (x0.floor() as usize).min(self.columns - 1);
        let last_column = ((x1.ceil() as usize).max(1) - 1).min(self.columns - 1);
        let low = offset as f64;
        let high = (offset + size) as f64;
        let first_row = (low / self.bytes_per_row).floor() as usize;
        let last_row =
            (((high / self.bytes_per_row).ceil() as usize).max(1) - 1).min(self.rows - 1);
        let rows = self.cells.iter_mut().zip(spans.iter_mut()).enumerate();
        for (row, (cells, span)) in rows.take(last_row + 1).skip(first_row) {
            let row_low = row as f64 * self.bytes_per_row;
            let bytes = high.min(row_low + self.bytes_per_row) - low.max(row_low);
            if bytes <= 0.0 {
                continue;
            }
            let weight = bytes;
            if first_column == last_column {
                cells[first_column] += weight * (x1 - x0);
            } else {
                cells[first_column] += weight * (first_column as f64 + 1.0 - x0);
                cells[last_column] += weight * (x1 - last_column as f64).min(1.0);
                span[first_column + 1] += weight;
                span[last_column] -= weight;
            }
        }
    }
}

/// The address axis of a map: the ranges a policy's blocks occupy, one
/// above the other, with the empty stretches of virtual addresses between
/// them cut out (a segment at 1 TiB is drawn just above one at 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressBands {
    /// (first virtual byte, end, where it starts on the axis), by address;
    /// empty: the axis is the addresses themselves.
    bands: Vec<(u64, u64, u64)>,
}

impl AddressBands {
    /// The bands of `placement`, whose blocks have `sizes` bytes by id: a
    /// stretch with no block longer than all the occupied bytes together
    /// is cut, leaving a gap of a fiftieth of them.
    pub fn of(placement: &Placement, sizes: &[u64]) -> Self {
        let mut ranges: Vec<(u64, u64)> = placement
            .offsets
            .iter()
            .zip(sizes)
            .filter(|&(&offset, _)| offset != u64::MAX)
            .map(|(&offset, &size)| (offset, offset.saturating_add(size)))
            .chain(
                placement
                    .moves
                    .iter()
                    .map(|&(_, id, to)| (to, to.saturating_add(sizes[id as usize]))),
            )
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (from, to) in ranges {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(to),
                _ => merged.push((from, to)),
            }
        }
        let occupied: u64 = merged.iter().map(|&(from, to)| to - from).sum();
        let mut clusters: Vec<(u64, u64)> = Vec::new();
        for (from, to) in merged {
            match clusters.last_mut() {
                Some(last) if from - last.1 <= occupied => last.1 = to,
                _ => clusters.push((from, to)),
            }
        }
        if clusters.len() <= 1 && clusters.first().is_none_or(|&(from, _)| from <= occupied) {
            return Self::default();
        }
        let gap = occupied / 50;
        let mut at = 0;
        let bands = clusters
            .into_iter()
            .map(|(from, to)| {
                let band = (from, to, at);
                at += to - from + gap;
                band
            })
            .collect();
        Self { bands }
    }

    /// Where virtual address `offset` lies on the axis.
    pub fn map(&self, offset: u64) -> u64 {
        match self
            .bands
            .iter()
            .rev()
            .find(|&&(from, _, _)| from <= offset)
        {
            Some(&(from, _, at)) => at + (offset - from),
            None => offset,
        }
    }

    /// The axis's height: the bytes of all bands and their gaps.
    pub fn span(&self) -> u64 {
        self.bands
            .last()
            .map_or(0, |&(from, to, at)| at + (to - from))
    }

    /// Each band as (where it starts on the axis, the virtual address it
    /// starts at); empty where nothing is cut.
    pub fn starts(&self) -> Vec<(u64, u64)> {
        self.bands.iter().map(|&(from, _, at)| (at, from)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_stretches_of_virtual_addresses_are_cut_out() {
        let tib = 1u64 << 40;
        let placement = Placement {
            offsets: vec![0, tib, tib + 100, u64::MAX],
            moves: vec![],
            mapped: vec![(0, 300)],
        };
        let bands = AddressBands::of(&placement, &[50, 100, 100, 7]);
        // 250 bytes occupied: a gap of 5 between the two bands.
        assert_eq!(bands.starts(), [(0, 0), (55, tib)]);
        assert_eq!(bands.map(tib + 100), 155);
        assert_eq!(bands.span(), 255);
        let dense = Placement {
            offsets: vec![0, 60],
            moves: vec![],
            mapped: vec![(0, 100)],
        };
        assert_eq!(AddressBands::of(&dense, &[50, 40]), AddressBands::default());
        assert_eq!(AddressBands::default().map(77), 77);
    }

    #[test]
    fn a_block_alive_throughout_fills_its_rows() {
        // Two blocks: one fills the lower half for all 10 events, one the
        // upper half for the first 5.
        let placement = Placement {
            offsets: vec![0, 50],
            moves: vec![],
            mapped: vec![(0, 100)],
        };
        let bands = AddressBands::default();
        let raster = Raster::new(
            &placement,
            &bands,
            &|e| e as f64,
            &[(0, 10), (0, 5)],
            &[50, 50],
            100,
            10,
            2,
        );
        assert!(
            raster.cells[0].iter().all(|&c| (c - 1.0).abs() < 1e-9),
            "{:?}",
            raster.cells[0]
        );
        assert!(raster.cells[1][..5].iter().all(|&c| (c - 1.0).abs() < 1e-9));
        assert!(raster.cells[1][5..].iter().all(|&c| c.abs() < 1e-9));
    }

    #[test]
    fn a_moved_block_shows_at_both_places() {
        let placement = Placement {
            offsets: vec![50],
            moves: vec![(2, 0, 0)],
            mapped: vec![(0, 100)],
        };
        let raster = Raster::new(
            &placement,
            &AddressBands::default(),
            &|e| e as f64,
            &[(0, 4)],
            &[50],
            100,
            4,
            2,
        );
        assert_eq!(raster.cells[1], vec![1.0, 1.0, 0.0, 0.0]);
        assert_eq!(raster.cells[0], vec![0.0, 0.0, 1.0, 1.0]);
    }
}
