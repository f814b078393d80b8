//! Software drawing on a window's pixels. Pure: a [`Surface`] over a `&mut [u32]`, no
//! system calls. Every operation clips to the surface and returns the rectangle it
//! changed (the damage), so that a hostile client's coordinates can only draw less.

use ictus_display::proto::{RasterOp, Rect, Segment};

/// A rectangle in `i32`, for clipping arithmetic without overflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Area {
    /// Left.
    pub x0: i32,
    /// Top.
    pub y0: i32,
    /// Right, exclusive.
    pub x1: i32,
    /// Bottom, exclusive.
    pub y1: i32,
}

impl Area {
    /// From a protocol rectangle.
    pub fn of(r: Rect) -> Area {
        Area {
            x0: r.x.into(),
            y0: r.y.into(),
            x1: i32::from(r.x) + i32::from(r.w),
            y1: i32::from(r.y) + i32::from(r.h),
        }
    }

    /// Whether it covers nothing.
    pub fn is_empty(&self) -> bool {
        self.x1 <= self.x0 || self.y1 <= self.y0
    }

    /// The intersection.
    pub fn clip(&self, o: &Area) -> Area {
        Area { x0: self.x0.max(o.x0), y0: self.y0.max(o.y0), x1: self.x1.min(o.x1), y1: self.y1.min(o.y1) }
    }

    /// The bounding box of both (an empty one counts as nothing).
    pub fn union(&self, o: &Area) -> Area {
        if self.is_empty() {
            return *o;
        }
        if o.is_empty() {
            return *self;
        }
        Area { x0: self.x0.min(o.x0), y0: self.y0.min(o.y0), x1: self.x1.max(o.x1), y1: self.y1.max(o.y1) }
    }

    /// Whether `o` lies inside.
    pub fn contains(&self, o: &Area) -> bool {
        o.is_empty() || (self.x0 <= o.x0 && self.y0 <= o.y0 && self.x1 >= o.x1 && self.y1 >= o.y1)
    }

    /// Width.
    pub fn w(&self) -> usize {
        (self.x1 - self.x0).max(0) as usize
    }

    /// Height.
    pub fn h(&self) -> usize {
        (self.y1 - self.y0).max(0) as usize
    }

    /// Back to a protocol rectangle (the area fits: it is clipped to a window).
    pub fn rect(&self) -> Rect {
        Rect::new(self.x0 as i16, self.y0 as i16, self.w() as u16, self.h() as u16)
    }
}

/// Pixels to draw on: `h` rows of `w` pixels, rows `w` apart.
#[derive(Debug)]
pub struct Surface<'a> {
    /// The pixels, `0x00RRGGBB`.
    pub px: &'a mut [u32],
    /// Width.
    pub w: usize,
    /// Height.
    pub h: usize,
}

fn apply(dst: &mut [u32], op: RasterOp, color: u32) {
    match op {
        RasterOp::Copy => dst.fill(color),
        RasterOp::Xor => dst.iter_mut().for_each(|p| *p ^= color),
    }
}

impl Surface<'_> {
    /// The whole surface.
    pub fn bounds(&self) -> Area {
        Area { x0: 0, y0: 0, x1: self.w as i32, y1: self.h as i32 }
    }

    /// Fill (or xor) a rectangle.
    pub fn fill(&mut self, r: Rect, op: RasterOp, color: u32) -> Area {
        let a = Area::of(r).clip(&self.bounds());
        if a.is_empty() {
            return Area::default();
        }
        for y in a.y0..a.y1 {
            let row = y as usize * self.w;
            apply(&mut self.px[row + a.x0 as usize..row + a.x1 as usize], op, color);
        }
        a
    }

    fn plot(&mut self, x: i32, y: i32, op: RasterOp, color: u32) {
        if x >= 0 && y >= 0 && (x as usize) < self.w && (y as usize) < self.h {
            let p = &mut self.px[y as usize * self.w + x as usize];
            *p = match op {
                RasterOp::Copy => color,
                RasterOp::Xor => *p ^ color,
            };
        }
    }

    /// Draw a segment, both ends included (Bresenham). Points outside are skipped; the
    /// walk is bounded by the segment's length (at most 65536 steps).
    pub fn segment(&mut self, s: Segment, op: RasterOp, color: u32) -> Area {
        let (mut x, mut y) = (i32::from(s.x1), i32::from(s.y1));
        let (x2, y2) = (i32::from(s.x2), i32::from(s.y2));
        let box_ = Area { x0: x.min(x2), y0: y.min(y2), x1: x.max(x2) + 1, y1: y.max(y2) + 1 }.clip(&self.bounds());
        if box_.is_empty() {
            return Area::default();
        }
        let dx = (x2 - x).abs();
        let dy = -(y2 - y).abs();
        let sx = if x < x2 { 1 } else { -1 };
        let sy = if y < y2 { 1 } else { -1 };
        let mut err = dx + dy;
        loop {
            self.plot(x, y, op, color);
            if x == x2 && y == y2 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
        box_
    }

    /// Draw text in 8×8 cells from `(x, y)`: glyph pixels in `fg`, the rest of each
    /// cell in `bg` if given.
    pub fn text(&mut self, x: i16, y: i16, fg: u32, bg: Option<u32>, text: &[u8]) -> Area {
        let mut damage = Area::default();
        for (i, &ch) in text.iter().enumerate() {
            let cx = i32::from(x) + 8 * i as i32;
            if cx >= self.w as i32 {
                break;
            }
            let cell = Area { x0: cx, y0: y.into(), x1: cx + 8, y1: i32::from(y) + 8 }.clip(&self.bounds());
            if cell.is_empty() {
                continue;
            }
            let glyph = glyph(ch);
            for (gy, bits) in glyph.iter().enumerate() {
                let py = i32::from(y) + gy as i32;
                if py < cell.y0 || py >= cell.y1 {
                    continue;
                }
                let row = py as usize * self.w;
                for gx in 0..8 {
                    let px = cx + gx;
                    if px < cell.x0 || px >= cell.x1 {
                        continue;
                    }
                    let on = bits & (1 << gx) != 0;
                    let p = &mut self.px[row + px as usize];
                    match (on, bg) {
                        (true, _) => *p = fg,
                        (false, Some(b)) => *p = b,
                        (false, None) => {}
                    }
                }
            }
            damage = damage.union(&cell);
        }
        damage
    }

    /// Copy `src` to `(dx, dy)`, both clipped; overlapping areas copy as if through a
    /// temporary (scrolling up or down works).
    pub fn copy_area(&mut self, src: Rect, dx: i16, dy: i16) -> Area {
        let b = self.bounds();
        let s = Area::of(src);
        let (ox, oy) = (i32::from(dx) - s.x0, i32::from(dy) - s.y0);
        // Clip the source, then the destination, and bring the source back in step.
        let s = s.clip(&b);
        let d = Area { x0: s.x0 + ox, y0: s.y0 + oy, x1: s.x1 + ox, y1: s.y1 + oy }.clip(&b);
        if d.is_empty() {
            return Area::default();
        }
        let (w, sx) = (d.w(), (d.x0 - ox) as usize);
        let rows: Box<dyn Iterator<Item = i32>> =
            if oy > 0 { Box::new((d.y0..d.y1).rev()) } else { Box::new(d.y0..d.y1) };
        for y in rows {
            let from = (y - oy) as usize * self.w + sx;
            let to = y as usize * self.w + d.x0 as usize;
            self.px.copy_within(from..from + w, to);
        }
        d
    }

    /// Draw an image of `r.w × r.h` pixels whose rows are `stride` bytes apart in
    /// `src` (at least `Request::image_len` bytes), clipped.
    pub fn put_image(&mut self, r: Rect, stride: usize, src: &[u8]) -> Area {
        let full = Area::of(r);
        let a = full.clip(&self.bounds());
        if a.is_empty() {
            return Area::default();
        }
        for y in a.y0..a.y1 {
            let sy = (y - full.y0) as usize;
            let sx = (a.x0 - full.x0) as usize;
            let from = sy * stride + sx * 4;
            let bytes = &src[from..from + a.w() * 4];
            let row = y as usize * self.w;
            let dst = &mut self.px[row + a.x0 as usize..row + a.x1 as usize];
            for (d, s) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                *d = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) & 0x00ff_ffff;
            }
        }
        a
    }
}

fn glyph(ch: u8) -> [u8; 8] {
    if ch < 128 {
        font8x8::legacy::BASIC_LEGACY[ch as usize]
    } else {
        // Not in the font: a hollow box, so the cell is visibly taken.
        [0xff, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0xff]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn surface(px: &mut [u32], w: usize, h: usize) -> Surface<'_> {
        Surface { px, w, h }
    }

    #[test]
    fn xor_twice_restores_and_fill_clips() {
        let mut px = vec![0x123456; 16 * 8];
        let before = px.clone();
        let mut s = surface(&mut px, 16, 8);
        let a = s.fill(Rect::new(-4, 2, 10, 100), RasterOp::Xor, 0xffffff);
        assert_eq!(a, Area { x0: 0, y0: 2, x1: 6, y1: 8 });
        s.fill(Rect::new(-4, 2, 10, 100), RasterOp::Xor, 0xffffff);
        assert_eq!(px, before);
        let mut s = surface(&mut px, 16, 8);
        assert!(s.fill(Rect::new(100, 0, 5, 5), RasterOp::Copy, 1).is_empty());
    }

    #[test]
    fn scrolling_up_and_down_moves_rows() {
        let (w, h) = (4, 6);
        let mut px: Vec<u32> = (0..(w * h) as u32).map(|i| i / w as u32).collect();
        let mut s = surface(&mut px, w, h);
        s.copy_area(Rect::new(0, 1, 4, 5), 0, 0); // up by one
        assert_eq!(px.chunks(w).map(|r| r[0]).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 5]);
        let mut s = surface(&mut px, w, h);
        s.copy_area(Rect::new(0, 0, 4, 5), 0, 1); // down by one
        assert_eq!(px.chunks(w).map(|r| r[0]).collect::<Vec<_>>(), vec![1, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn text_draws_glyph_bits_and_background() {
        let mut px = vec![0u32; 16 * 8];
        let mut s = surface(&mut px, 16, 8);
        let a = s.text(0, 0, 0xffffff, Some(0x0000ff), b"A");
        assert_eq!(a, Area { x0: 0, y0: 0, x1: 8, y1: 8 });
        let on = px.iter().filter(|&&p| p == 0xffffff).count();
        let bits: u32 = font8x8::legacy::BASIC_LEGACY[b'A' as usize].iter().map(|b| b.count_ones()).sum();
        assert_eq!(on as u32, bits);
        assert_eq!(px.iter().filter(|&&p| p == 0x0000ff).count(), 64 - on);
    }

    #[test]
    fn lines_include_both_ends() {
        let mut px = vec![0u32; 10 * 10];
        let mut s = surface(&mut px, 10, 10);
        s.segment(Segment { x1: 0, y1: 0, x2: 9, y2: 9 }, RasterOp::Copy, 7);
        assert!((0..10).all(|i| px[i * 10 + i] == 7));
        assert_eq!(px.iter().filter(|&&p| p == 7).count(), 10);
    }

    proptest! {
        #[test]
        fn no_coordinates_reach_outside(x: i16, y: i16, w: u16, h: u16, dx: i16, dy: i16, x2: i16, y2: i16) {
            let mut px = vec![0u32; 33 * 17];
            let mut s = surface(&mut px, 33, 17);
            let r = Rect { x, y, w, h };
            prop_assert!(s.bounds().contains(&s.fill(r, RasterOp::Xor, 1)));
            prop_assert!(s.bounds().contains(&s.copy_area(r, dx, dy)));
            prop_assert!(s.bounds().contains(&s.text(x, y, 1, Some(2), b"hello")));
            let seg = Segment { x1: x % 200, y1: y % 200, x2: x2 % 200, y2: y2 % 200 };
            prop_assert!(s.bounds().contains(&s.segment(seg, RasterOp::Copy, 3)));
            let img = vec![9u8; 4 * 5 * 3];
            let r = Rect { x, y, w: 5, h: 3 };
            prop_assert!(s.bounds().contains(&s.put_image(r, 20, &img)));
        }
    }
}
